package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// bed is one integration test's database, table and settings.
type bed struct {
	s     testenv.Settings
	db    *sqlx.DB
	table Table
}

// newBed migrates db (a fresh database of testenv.EachDB) and returns the
// bed on it.
func newBed(t *testing.T, db *sqlx.DB) *bed {
	t.Helper()
	s := testenv.Integration(t)
	tb, err := NewTable("")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, migrateOutbox(ctx, db, ""))
	return &bed{s: s, db: db, table: tb}
}

// eachDB runs body on a fresh bed on each database (testenv.EachDB), the
// two as parallel subtests.
func eachDB(t *testing.T, body func(t *testing.T, b *bed)) {
	t.Helper()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		body(t, newBed(t, db))
	})
}

// eachDBSerial is eachDB with the databases one after the other: for a
// test whose sends are heavy enough (megabytes per message) that two at once
// would time out on a loaded broker.
func eachDBSerial(t *testing.T, body func(t *testing.T, b *bed)) {
	t.Helper()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) { body(t, newBed(t, db)) })
}

// exec runs a fixture statement written with "?" placeholders on b's
// database.
func (b *bed) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	_, err := b.db.Exec(b.db.Rebind(q), args...)
	require.NoError(t, err)
}

// enqueue writes events in transactions of at most 200 rows.
func (b *bed) enqueue(t *testing.T, events ...Event) []string {
	t.Helper()
	ctx := context.Background()
	var ids []string
	for len(events) > 0 {
		n := min(200, len(events))
		tx, err := b.db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		for _, e := range events[:n] {
			id, err := b.table.Enqueue(ctx, tx, e)
			require.NoError(t, err)
			ids = append(ids, id)
		}
		require.NoError(t, tx.Commit())
		events = events[n:]
	}
	return ids
}

func (b *bed) counts(t *testing.T) map[Status]int {
	t.Helper()
	c, err := b.table.CountByStatus(context.Background(), b.db)
	require.NoError(t, err)
	return c
}

func (b *bed) waitStatus(t *testing.T, st Status, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	testenv.Eventually(t, timeout+time.Second, fmt.Sprintf("%d rows %s", n, st), func() bool {
		if b.counts(t)[st] >= n {
			return true
		}
		if time.Now().After(deadline) {
			b.dump(t)
		}
		return false
	})
}

// dump logs the rows not yet SENT or DEAD (at most 10), to explain a timeout.
func (b *bed) dump(t *testing.T) {
	t.Helper()
	var rows []struct {
		ID    string         `db:"event_id"`
		St    string         `db:"status"`
		Retry int            `db:"retry_count"`
		Code  sql.NullString `db:"last_error_code"`
		Msg   sql.NullString `db:"last_error_message"`
	}
	_ = b.db.Select(&rows, "SELECT event_id, status, retry_count, last_error_code, last_error_message FROM "+b.table.Name()+
		" WHERE status NOT IN ('SENT', 'DEAD') LIMIT 10")
	t.Logf("counts %v; unfinished rows:", b.counts(t))
	for _, r := range rows {
		t.Logf("  %s %s retries=%d code=%s err=%s", r.ID, r.St, r.Retry, r.Code.String, r.Msg.String)
	}
}

func (b *bed) sink(t *testing.T, nameServers ...string) *RocketMQSink {
	t.Helper()
	if len(nameServers) == 0 {
		nameServers = []string{b.s.NameServer}
	}
	s, err := NewRocketMQSink(RocketMQConfig{NameServers: nameServers, Group: testenv.Name(t, "pg"),
		InstanceName: testenv.Name(t, "inst")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func (b *bed) dispatcher(t *testing.T, cfg Config) *Dispatcher {
	t.Helper()
	cfg.DB = b.db
	d, err := NewDispatcher(cfg)
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, d.Shutdown(ctx))
	})
	return d
}

func events(topic string, n int) []Event {
	out := make([]Event, n)
	for i := range out {
		out[i] = Event{EventType: "ThingHappened", EventVersion: 1, Destination: topic,
			MessageKey: fmt.Sprintf("k-%d", i), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
	}
	return out
}

// countingSink counts sends per event id in front of another sink.
type countingSink struct {
	next Sink
	mu   sync.Mutex
	ok   map[string]int // successful sends
	all  int
}

func counting(next Sink) *countingSink { return &countingSink{next: next, ok: map[string]int{}} }

func (c *countingSink) Send(ctx context.Context, m *Message) error {
	err := c.next.Send(ctx, m)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all++
	if err == nil {
		c.ok[m.EventID]++
	}
	return err
}

// countingBatch is countingSink in front of a BatchSink, and a BatchSink
// itself: a dispatcher with it holds its claims (held.go).
type countingBatch struct {
	*countingSink
	b BatchSink
}

func countingB(next BatchSink) countingBatch {
	return countingBatch{countingSink: counting(next), b: next}
}

func (c countingBatch) Batches(msgs []*Message) [][]*Message { return c.b.Batches(msgs) }

func (c countingBatch) SendBatch(ctx context.Context, msgs []*Message) []error {
	errs := c.b.SendBatch(ctx, msgs)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all += len(msgs)
	for i, m := range msgs {
		if errs[i] == nil {
			c.ok[m.EventID]++
		}
	}
	return errs
}

// sinkKinds are the two ways a dispatcher sends: held claims with a
// BatchSink (one write per row), and the plain Sink's two writes.
var sinkKinds = []struct {
	name string
	held bool
}{{"held", true}, {"two writes", false}}

// countingKind wraps next in a counting sink of the kind held asks for.
func countingKind(next *RocketMQSink, held bool) (Sink, *countingSink) {
	if held {
		c := countingB(next)
		return c, c.countingSink
	}
	c := counting(next)
	return c, c
}

func (c *countingSink) snapshot() (perID map[string]int, attempts int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp := make(map[string]int, len(c.ok))
	for k, v := range c.ok {
		cp[k] = v
	}
	return cp, c.all
}

// freePort returns a loopback port nothing listens on (right now).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// forwarder is a TCP proxy from a loopback port to target, standing in for
// a name server that comes back up on its old address.
type forwarder struct {
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func forward(t *testing.T, port int, target string) *forwarder {
	t.Helper()
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	require.NoError(t, err)
	f := &forwarder{l: l}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, up)
			f.mu.Unlock()
			f.wg.Add(2)
			go func() { defer f.wg.Done(); _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { defer f.wg.Done(); _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
	t.Cleanup(f.close)
	return f
}

func (f *forwarder) close() {
	_ = f.l.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
