package txproducer_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

const testFenceAge = 4 * time.Second // broker: transactionTimeOut 3 s, interval 2 s, max 5 or more

var errBusiness = errors.New("business rule says no")

// bundle is one test's world: a fresh database, topic, group and collector.
type bundle struct {
	s     testenv.Settings
	db    *sqlx.DB
	store *txlog.Store
	topic string
	group string
	coll  *testenv.Collector
	rec   *recorder
}

// setup is setupOn a MariaDB database (testenv.DB), for the tests whose
// subject is the broker or the client, not the database.
func setup(t *testing.T, queues int) *bundle {
	t.Helper()
	return setupOn(t, testenv.DB(t), queues)
}

// eachDB runs body on a fresh bundle with a topic of queues queues on each
// database (testenv.EachDB), the two as parallel subtests.
func eachDB(t *testing.T, queues int, body func(t *testing.T, b *bundle)) {
	t.Helper()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		body(t, setupOn(t, db, queues))
	})
}

// setupOn migrates db (a fresh database) and creates the business table,
// a topic and its collector.
func setupOn(t *testing.T, db *sqlx.DB, queues int) *bundle {
	t.Helper()
	s := testenv.Integration(t)
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
	_, err = db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, amount INT NOT NULL)")
	require.NoError(t, err)
	b := &bundle{s: s, db: db, store: store, topic: testenv.Name(t, "topic"), group: testenv.Name(t, "pg"), rec: newRecorder()}
	testenv.CreateTopic(t, b.topic, queues)
	b.coll = testenv.Collect(t, b.topic)
	return b
}

func (b *bundle) config() txproducer.Config {
	return txproducer.Config{
		NameServers:     []string{b.s.NameServer},
		Group:           b.group,
		DB:              b.db,
		FenceAge:        testFenceAge,
		CheckTimeout:    10 * time.Second,
		WarmupTopics:    []string{b.topic},
		DisableRecovery: true,
		OnCheck:         b.rec.add,
	}
}

func startProducer(t *testing.T, cfg txproducer.Config) *txproducer.Producer {
	t.Helper()
	p, err := txproducer.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, p.Shutdown(ctx))
	})
	return p
}

func (b *bundle) msg(id string) txproducer.Message {
	return txproducer.Message{Topic: b.topic, EventID: id, EventType: "OrderPlaced", BusinessKey: "order-" + id,
		Payload: []byte(`{"order":"` + id + `"}`)}
}

// insertOrder is the business write of most tests.
func insertOrder(id string) txproducer.LocalTxFunc {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (id, amount) VALUES (?, 1)"), id)
		return err
	}
}

// sendMarker commits one more event on the topic and waits until the
// collector consumed it: everything the broker made consumable before it
// on a one-queue topic has been delivered by then.
func (b *bundle) sendMarker(t *testing.T, p *txproducer.Producer) {
	t.Helper()
	id := "marker-" + testenv.RandSuffix(8)
	res, err := p.Send(context.Background(), b.msg(id), insertOrder(id))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "marker not consumed")
}

func (b *bundle) row(t *testing.T, id string) txlog.Row {
	t.Helper()
	r, err := b.store.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}

func (b *bundle) waitRow(t *testing.T, id string, state txlog.State) txlog.Row {
	t.Helper()
	var r txlog.Row
	testenv.Eventually(t, 60*time.Second, "txlog row "+id+" "+string(state), func() bool {
		var err error
		r, err = b.store.Get(context.Background(), id)
		return err == nil && r.State == state
	})
	return r
}

// recorder keeps every check answer, per event id.
type recorder struct {
	mu      sync.Mutex
	answers map[string][]checkback.Answer
	changed chan struct{}
}

func newRecorder() *recorder {
	return &recorder{answers: map[string][]checkback.Answer{}, changed: make(chan struct{})}
}

func (r *recorder) add(a checkback.Answer) {
	r.mu.Lock()
	r.answers[a.EventID] = append(r.answers[a.EventID], a)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *recorder) get(id string) []checkback.Answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]checkback.Answer(nil), r.answers[id]...)
}

// wait blocks until cond holds for id's answers.
func (r *recorder) wait(ctx context.Context, id string, cond func([]checkback.Answer) bool) error {
	for {
		r.mu.Lock()
		ch := r.changed
		ok := cond(r.answers[id])
		r.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("waiting for check answers of %s: %w (have %v)", id, ctx.Err(), r.get(id))
		}
	}
}

func (r *recorder) waitT(t *testing.T, id string, what string, cond func([]checkback.Answer) bool) []checkback.Answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, r.wait(ctx, id, cond), what)
	return r.get(id)
}

func hasDecision(d checkback.Decision) func([]checkback.Answer) bool {
	return func(as []checkback.Answer) bool {
		for _, a := range as {
			if a.Decision == d {
				return true
			}
		}
		return false
	}
}

// noUnknownPastFenceAge asserts I3's "never UNKNOWN past the fence age".
func noUnknownPastFenceAge(t *testing.T, as []checkback.Answer) {
	t.Helper()
	for _, a := range as {
		if a.Age >= testFenceAge {
			require.NotEqual(t, checkback.Unknown, a.Decision, "UNKNOWN past the fence age: %+v", a)
		}
	}
}

// proxy is a TCP proxy to the database server that a test can take down and bring back:
// a real "database down" as the producer sees it.
type proxy struct {
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	p := &proxy{target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(p.down)
	return p
}

func (p *proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[up] = true, true
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
			go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
		}
	}()
}

func (p *proxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]bool{}
}

func (p *proxy) up(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	require.NoError(t, err)
	p.serve(ln)
}
