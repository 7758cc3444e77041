package consumer

import (
	"context"
	"errors"
	"fmt"
	"os"
	oexec "os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/wire"
)

const (
	envCrashDB     = "RMQTX_CONSUMER_CRASH_DB"
	envCrashTopic  = "RMQTX_CONSUMER_CRASH_TOPIC"
	envCrashGroup  = "RMQTX_CONSUMER_CRASH_GROUP"
	envCrashPoison = "RMQTX_CONSUMER_CRASH_POISON"
	envCrashMax    = "RMQTX_CONSUMER_CRASH_MAX_RETRIES"
)

// TestHelperProcessCrashingHandler is not a test: TestHandlerCrashParked
// re-executes the test binary to run it as a consumer process whose handler
// kills its own process with SIGKILL when it is handed the poison event (no
// failpoint: the handler itself is the fault, as an os.Exit or an OOM kill
// in a user's handler would be).
func TestHelperProcessCrashingHandler(t *testing.T) {
	if !testenv.IsChild(t) {
		return // only meaningful as the child process
	}
	db := testenv.OpenDBRefEnv(t, envCrashDB)
	maxRetries, err := strconv.Atoi(os.Getenv(envCrashMax))
	require.NoError(t, err)
	poison := os.Getenv(envCrashPoison)
	handler := func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
		if ev.ID == poison {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal ends the process
		}
		return effectHandler(ctx, tx, ev)
	}
	c, err := New(Config{
		Group: os.Getenv(envCrashGroup), DB: db, MaxRetries: maxRetries,
		Routes:      map[string]Route{"Created": {Handler: handler}},
		NameServers: []string{testenv.Load().NameServer},
		Topic:       os.Getenv(envCrashTopic),
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	watchdog, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	<-watchdog.Done()
	t.Fatal("the poison event never reached the crashing handler")
}

// A handler that kills its process is counted before it runs: its first
// crash leaves the queue's crash-count window past the message (a first
// delivery on a fresh queue is covered, not counted: window.go), so every
// later delivery counts; after MaxRetries+2 crashes (each a real child
// process killed by its own handler), the next delivery parks the message
// with class crash, without running the handler, and the next event of the
// topic is applied.
func TestHandlerCrashParked(t *testing.T) {
	t.Parallel()
	eachDB(t, testHandlerCrashParked)
}

func testHandlerCrashParked(t *testing.T, db *sqlx.DB) {
	const maxRetries = 1 // three crashes (the first seen as the window), then parked
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 1)
	poison := wire.NewEventID()
	newPublisher(t).send(topic, ev(poison, "Created"), []byte(`{"n":"poison"}`))

	const crashes = maxRetries + 2
	for crash := 1; crash <= crashes; crash++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := testenv.Child{Test: "TestHelperProcessCrashingHandler", Env: []string{
			envCrashDB + "=" + testenv.DBRef(t, db), envCrashTopic + "=" + topic, envCrashGroup + "=" + group,
			envCrashPoison + "=" + poison, envCrashMax + "=" + strconv.Itoa(maxRetries),
		}}.Command(ctx)
		out, err := cmd.CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		var ee *oexec.ExitError
		require.True(t, errors.As(err, &ee), "child %d: %v\n%s", crash, err, out)
		ws, ok := ee.Sys().(syscall.WaitStatus)
		require.True(t, ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL && !timedOut,
			"child %d was not killed by its handler: %v\n%s", crash, err, out)
		if crash == 1 {
			require.Zero(t, attemptRows(t, db, group, poison), "the first delivery was covered by the window, not counted")
			require.Equal(t, windowSpan, countRows(t, db, "SELECT high_offset FROM rmqtx_consume_window WHERE consumer_group = ? AND topic = ?", group, topic),
				"the window committed past the poison's offset (0) before its handler ran")
		} else {
			require.Equal(t, 1, attemptRows(t, db, group, poison), "one attempt row")
			require.Equal(t, crash-1, countRows(t, db, "SELECT attempts FROM rmqtx_consume_attempt WHERE consumer_group = ? AND event_id = ?", group, poison),
				"crash %d counted before the handler ran (a suspect of the window)", crash)
		}
		testenv.AwaitGroupEmpty(t, group, 3*time.Minute)
	}
	require.Zero(t, effects(t, db))

	var ran atomic.Int32
	c := startConsumer(t, db, topic, group, map[string]Route{"Created": {Handler: func(ctx context.Context, tx *sqlx.Tx, e Event) error {
		if e.ID == poison {
			ran.Add(1)
		}
		return effectHandler(ctx, tx, e)
	}}}, func(c *Config) { c.MaxRetries = maxRetries })
	if !testenv.Await(90*time.Second, func() bool { return c.Processor().Stats().Parked == 1 }) {
		t.Fatalf("timed out after 90s waiting for the poison to be parked: stats %+v; %s",
			c.Processor().Stats(), testenv.DescribeGroup(t, topic, group, 1))
	}
	require.Zero(t, ran.Load(), "the handler did not run a third time")
	var dl struct {
		Class string `db:"error_class"`
		Text  string `db:"error_text"`
	}
	require.NoError(t, db.Get(&dl, db.Rebind("SELECT error_class, error_text FROM rmqtx_dead_letter WHERE consumer_group = ? AND event_id = ?"), group, poison))
	require.Equal(t, string(ClassCrash), dl.Class)
	require.Contains(t, dl.Text, ErrHandlerCrash.Error())
	require.Zero(t, attemptRows(t, db, group, poison), "the park cleared the attempt row")
	require.Zero(t, effects(t, db))

	// The queue moves on: the next event is applied, its count cleared with it.
	next := wire.NewEventID()
	newPublisher(t).send(topic, ev(next, "Created"), []byte(`{"n":"next"}`))
	if !testenv.Await(90*time.Second, func() bool { return c.Processor().Stats().Applied == 1 }) {
		t.Fatalf("timed out after 90s waiting for the next event: stats %+v", c.Processor().Stats())
	}
	require.Equal(t, 1, effects(t, db))
	require.Zero(t, attemptRows(t, db, group, next))
	t.Logf("COUNTS crash park: crashes=%d parked=%d effects=%d handler_runs_after=%d", crashes, c.Processor().Stats().Parked, effects(t, db), ran.Load())
}

// Counting in the Processor alone: a crash is an attempt whose mark stays;
// a failure records over the mark without counting twice; a success and a
// dedup hit delete the row; an event whose effect committed is a dedup hit
// however many crashes its row shows, never parked. Attempts left marked by
// a "crashed" attempt are planted as a crash leaves them (a count with no
// handler run after it).
func TestCrashCounting(t *testing.T) {
	t.Parallel()
	eachDB(t, testCrashCounting)
}

func testCrashCounting(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	fail := map[string]bool{}
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.MaxRetries = 2
		c.Routes["Created"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, e Event) error {
			if fail[e.ID] {
				return Transient(errors.New("not yet"))
			}
			return effectHandler(ctx, tx, e)
		}}
	})
	g := p.Config().Group
	crash := func(id string) { // what a process that dies in the handler leaves
		it := item{ev: Event{ID: id}}
		p.countAttempt(ctx, &it)
		require.True(t, it.ev.counted)
	}
	row := func(id string) (attempts int, class string) {
		var r struct {
			A int    `db:"attempts"`
			C string `db:"last_class"`
		}
		require.NoError(t, db.Get(&r, db.Rebind("SELECT attempts, last_class FROM rmqtx_consume_attempt WHERE consumer_group = ? AND event_id = ?"), g, id))
		return r.A, r.C
	}

	// A failure after a crash: counted once each, the failure's class recorded.
	a := wire.NewEventID()
	crash(a)
	fail[a] = true
	o := p.Process(ctx, msg(ev(a, "Created"), "a"))
	require.Equal(t, ResultRetry, o.Result)
	require.Equal(t, 2, o.Attempt)
	n, c := row(a)
	require.Equal(t, 2, n)
	require.Equal(t, string(ClassTransient), c)
	fail[a] = false
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(a, "Created"), "a")).Result, "2 attempts before, not all crashes: runs")
	require.Zero(t, attemptRows(t, db, g, a), "the success deleted the row")

	// Crashes up to the bound: the handler runs; past it: parked as crash.
	b := wire.NewEventID()
	crash(b)
	crash(b)
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(b, "Created"), "b")).Result, "2 crashes <= MaxRetries 2: runs again")
	cc := wire.NewEventID()
	crash(cc)
	crash(cc)
	crash(cc)
	o = p.Process(ctx, msg(ev(cc, "Created"), "c"))
	require.Equal(t, ResultParked, o.Result)
	require.Equal(t, ClassCrash, o.Class)
	require.ErrorIs(t, o.Err, ErrHandlerCrash)
	require.Zero(t, attemptRows(t, db, g, cc))
	require.Equal(t, 2, effects(t, db), "a and b, not c")

	// Committed, then crashes before the ACK, many times: a dedup hit.
	d := wire.NewEventID()
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(d, "Created"), "d")).Result)
	for range 4 {
		crash(d)
	}
	q := newProc(t, db, func(c *ProcessorConfig) { c.Group = g; c.MaxRetries = 2; c.DedupCacheSize = -1 })
	require.Equal(t, ResultDuplicate, q.Process(ctx, msg(ev(d, "Created"), "d")).Result)
	require.Zero(t, attemptRows(t, db, g, d), "the dedup hit deleted the row")

	// Batch mode: the crashed event runs alone, its neighbours in the batch.
	e1, e2, e3 := wire.NewEventID(), wire.NewEventID(), wire.NewEventID()
	crash(e2)
	crash(e2)
	crash(e2)
	outs := p.ProcessBatch(ctx, []Message{msg(ev(e1, "Created"), "1"), msg(ev(e2, "Created"), "2"), msg(ev(e3, "Created"), "3")})
	require.Equal(t, ResultApplied, outs[0].Result)
	require.Equal(t, ResultParked, outs[1].Result)
	require.Equal(t, ClassCrash, outs[1].Class)
	require.Equal(t, ResultApplied, outs[2].Result)
	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE consumer_group = ?", g))
	require.Equal(t, 5, effects(t, db))
	var dl int
	require.NoError(t, db.Get(&dl, db.Rebind("SELECT COUNT(*) FROM rmqtx_dead_letter WHERE consumer_group = ? AND error_class = 'crash'"), g))
	require.Equal(t, 2, dl)
}

// What crash counting costs a first delivery that applies, counted with
// MariaDB's session counters on the pool's one connection: one INSERT (the
// count) before the transaction and one DELETE of it inside, no read; and
// for a first delivery its queue's window covers, nothing but the window's
// read and write once per windowSpan offsets. With NoCrashCount, nothing
// (TestAttemptBookkeepingCostsNoStatementOnFirstDeliveries).
func TestCrashCountCost(t *testing.T) {
	t.Parallel()
	// MariaDB only: PostgreSQL keeps no per-session command counters; the
	// statements are the same on both databases.
	db := setupDB(t, testenv.MySQLDB(t))
	one := testenv.Reopen(t, db)
	one.SetMaxOpenConns(1)
	one.SetMaxIdleConns(1)
	ctx := context.Background()
	status := func() map[string]int {
		rows, err := one.QueryxContext(ctx, "SHOW SESSION STATUS WHERE Variable_name IN ('Com_delete', 'Com_select', 'Com_insert', 'Com_commit')")
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var k string
			var v int
			require.NoError(t, rows.Scan(&k, &v))
			out[k] = v
		}
		require.NoError(t, rows.Err())
		return out
	}
	p := newProc(t, one, nil)
	const n = 20
	before := status()
	for i := range n {
		require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(wire.NewEventID(), "Created"), fmt.Sprint(i))).Result)
	}
	after := status()
	require.Equal(t, 3*n, after["Com_insert"]-before["Com_insert"], "the count, the dedup row and the handler's effect, per event")
	require.Equal(t, n, after["Com_delete"]-before["Com_delete"], "the count deleted in the success's transaction")
	require.Equal(t, before["Com_select"], after["Com_select"], "no read")
	require.Zero(t, countRows(t, one, "SELECT COUNT(*) FROM rmqtx_consume_attempt"))
	t.Logf("statements for %d first deliveries with crash counting: %v -> %v", n, before, after)

	// First deliveries from a queue (as MessageFromExt names them), past
	// any window: no count, no delete; one read and one write of the
	// window per windowSpan offsets (window.go).
	const m = 3 * windowSpan
	before = status()
	for off := range int64(m) {
		require.Equal(t, ResultApplied, p.Process(ctx, qmsg(wire.NewEventID(), 0, off)).Result)
	}
	after = status()
	require.Equal(t, 2*m+3, after["Com_insert"]-before["Com_insert"], "the dedup row and the handler's effect per event, and 3 window writes")
	require.Zero(t, after["Com_delete"]-before["Com_delete"], "nothing to delete")
	require.Equal(t, 3, after["Com_select"]-before["Com_select"], "3 window reads")
	t.Logf("statements for %d first deliveries covered by the window: %v -> %v", m, before, after)
}

// Copies of one event delivered while its first copy's handler runs in the
// same process (a duplicate storm, a redelivery during a slow handler) are
// not crashes: more copies than MaxRetries+1, some of them in batches next
// to a fresh event, queue up behind the running copy (each blocked on its
// dedup row), which then fails once; the copy that runs next applies the
// event. One effect, no dead letter, no crash warning, and one count in the
// attempt row: the first copy's (the others did not touch it).
func TestOverlappingCopiesAreNotCrashes(t *testing.T) {
	t.Parallel()
	eachDB(t, testOverlappingCopiesAreNotCrashes)
}

func testOverlappingCopiesAreNotCrashes(t *testing.T, db *sqlx.DB) {
	const maxRetries, copies, batched = 3, 12, 4 // the last `batched` copies come in a batch with a fresh event each
	ctx := context.Background()
	l, hook := logtest.NewNullLogger()
	l.SetLevel(logrus.InfoLevel)
	watch := testenv.Reopen(t, db) // the lock watcher's own pool
	queued := func() bool {
		single, err1 := testenv.LockWaiters(watch, "INSERT INTO rmqtx_consume_log")
		batch, err2 := testenv.LockWaiters(watch, "INSERT IGNORE INTO rmqtx_consume_log") // MySQL's batch insert
		return err1 == nil && err2 == nil && single+batch >= copies-1
	}
	x := wire.NewEventID()
	var calls atomic.Int32
	var overlapped atomic.Bool
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.MaxRetries = maxRetries
		c.Observe = observe.Observe{Logger: l}
		c.Routes["Created"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, e Event) error {
			if e.ID == x && calls.Add(1) == 1 {
				// The first copy to run waits until every other copy waits
				// for it, then fails once.
				overlapped.Store(testenv.Await(60*time.Second, queued))
				return Transient(errors.New("the first copy fails once"))
			}
			return effectHandler(ctx, tx, e)
		}}
	})
	outs := make([]Outcome, copies)
	fresh := make([]Outcome, batched)
	var wg sync.WaitGroup
	for i := range copies {
		m := msg(ev(x, "Created"), `{"n":"x"}`)
		if i < copies-batched {
			wg.Go(func() { outs[i] = p.Process(ctx, m) })
			continue
		}
		y := msg(ev(wire.NewEventID(), "Created"), fmt.Sprintf(`{"n":%d}`, i))
		wg.Go(func() {
			o := p.ProcessBatch(ctx, []Message{m, y})
			outs[i], fresh[i-(copies-batched)] = o[0], o[1]
		})
	}
	wg.Wait()
	require.True(t, overlapped.Load(), "the other %d copies never all waited for the first", copies-1)

	byResult := map[Result]int{}
	for _, o := range outs {
		byResult[o.Result]++
		require.NotEqual(t, ClassCrash, o.Class, "%+v", o)
		if o.Err != nil {
			t.Logf("copy: %s %s %v", o.Result, o.Class, o.Err)
		}
	}
	require.Equal(t, map[Result]int{ResultRetry: 1, ResultApplied: 1, ResultDuplicate: copies - 2}, byResult)
	for _, o := range fresh {
		require.Equal(t, ResultApplied, o.Result, "%+v", o)
	}
	require.Equal(t, 1+batched, effects(t, db), "the event once, and each batch's fresh event")
	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter"))
	for _, e := range hook.AllEntries() {
		require.NotContains(t, e.Message, "ended its process", "no copy took the running one for a crash")
	}
	g := p.Config().Group
	if attemptRows(t, db, g, x) > 0 { // the failed first copy's row, unless the winner's commit deleted it
		require.Equal(t, 1, countRows(t, db, "SELECT attempts FROM rmqtx_consume_attempt WHERE consumer_group = ? AND event_id = ?", g, x),
			"only the first copy counted")
	}
	// The failed copy's redelivery: a dedup hit, which clears the row.
	m := msg(ev(x, "Created"), `{"n":"x"}`)
	m.Delivery.ReconsumeTimes = 1
	require.Equal(t, ResultDuplicate, p.Process(ctx, m).Result)
	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE consumer_group = ?", g))
	require.Equal(t, 1+batched, effects(t, db))
	t.Logf("COUNTS overlapping copies: copies=%d results=%v effects=%d", copies, byResult, effects(t, db))
}
