package txproducer_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// faultBed is one private broker with one topic of one queue, a fresh
// database, and a raw collector on the topic: the independent judge of
// what the broker delivered (the producer's own hooks only report).
type faultBed struct {
	*bundle
	broker *privateBroker
	pub    rocketmq.Producer // a raw producer for settle markers
}

// TestBrokerFaults stops, kills and restarts a private broker (never the
// shared one) around Sends, on each database in turn (one private broker
// serves both halves, so they do not run in parallel). The outcomes are
// counted by a raw collector on the topic, after a settle marker: every
// committed event stored once, no rolled-back or failed one stored at all.
// No duration is asserted; the time the broker and the producer took is
// reported with t.Logf. Not parallel: t.Setenv below.
func TestBrokerFaults(t *testing.T) {
	testenv.Integration(t)
	pb := startPrivateBroker(t)
	// The collector and the marker producer (testenv.Collect, testenv.Producer)
	// find their broker through RMQTX_NAMESRV: the private one's here.
	t.Setenv("RMQTX_NAMESRV", pb.NameServer)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		// A failed first half may have left the broker frozen or killed;
		// this one starts on a running broker all the same (services.sh up
		// returns at once for a running one).
		pb.thaw(t)
		pb.restart(t)
		f := newFaultBed(t, pb, db)
		// Each case leaves the broker running for the next; after a failure
		// the next ones would fail for its reason, so they do not run.
		_ = t.Run("test bed settings avoid re-stores", f.testSettings) &&
			t.Run("half stored after LocalTxTimeout", f.testHalfStoredLate) &&
			t.Run("half never stored", f.testHalfNeverStored) &&
			t.Run("restart with pending halves", f.testRestartWithPendingHalves)
	})
}

func newFaultBed(t *testing.T, pb *privateBroker, db *sqlx.DB) *faultBed {
	t.Helper()
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
	_, err = db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, amount INT NOT NULL)")
	require.NoError(t, err)
	s := testenv.Load()
	s.NameServer, s.Broker = pb.NameServer, pb.Addr
	f := &faultBed{broker: pb, bundle: &bundle{s: s, db: db, store: store, topic: testenv.Name(t, "topic"),
		group: testenv.Name(t, "pg"), rec: newRecorder()}}
	// One queue: a marker sent after everything else is delivered after it.
	pb.createTopic(t, f.topic, 1)
	f.coll = testenv.Collect(t, f.topic)
	f.pub = testenv.Producer(t)
	return f
}

// settle makes the collector's counts final for everything the broker
// stored on the topic before settle was called. It sends a marker to the
// topic's one queue with the raw producer and waits until the collector
// got it, twice: the first marker's delivery means every message stored
// before it was pulled and handed to the client's consume goroutines, one
// per message, which may count the marker before an older message of the
// same pull; the second marker is sent only after that, so by its delivery
// those goroutines have long counted theirs.
func (f *faultBed) settle(t *testing.T) testenv.Snapshot {
	t.Helper()
	start := time.Now()
	f.marker(t)
	f.marker(t)
	t.Logf("settled in %s", time.Since(start).Round(10*time.Millisecond))
	return f.coll.Snapshot()
}

// marker sends one marker and waits until the collector got it. A send may
// fail while the clients reconnect to a restarted broker; it is sent again
// then (a second copy of a marker is harmless).
func (f *faultBed) marker(t *testing.T) {
	t.Helper()
	marker := "marker-" + testenv.RandSuffix(8)
	delivered := func(s testenv.Snapshot) bool { return s.Counts[marker] > 0 }
	var sent bool
	var sendErr error
	got := testenv.Await(2*time.Minute, func() bool {
		if !sent {
			m := primitive.NewMessage(f.topic, []byte("marker"))
			m.WithProperty(wire.PropEventID, marker)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, sendErr = f.pub.SendSync(ctx, m)
			cancel()
			sent = sendErr == nil
		}
		return sent && f.coll.WaitUntil(time.Second, delivered)
	})
	require.True(t, got, "the settle marker was not delivered (sent: %v, last send error: %v)", sent, sendErr)
}

// requireStopped waits until the kernel reports the frozen broker's
// process as stopped (state T in /proc/<pid>/stat): SIGSTOP is delivered
// asynchronously, and a freeze that did not hold would let a half through.
func (f *faultBed) requireStopped(t *testing.T) {
	t.Helper()
	pid := f.broker.pid()
	state := ""
	stopped := testenv.Await(10*time.Second, func() bool {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			state = err.Error()
			return false
		}
		// pid (comm) state ...: comm may hold spaces, the state follows its ')'.
		if i := strings.LastIndexByte(string(b), ')'); i >= 0 && i+2 < len(b) {
			state = string(b[i+2])
		}
		return state == "T"
	})
	require.True(t, stopped, "the broker (pid %d) did not stop on SIGSTOP: state %q", pid, state)
}

// awaitArrival waits until the collector got each of ids and fails the
// test with what it saw when they do not come. A Send that reports a
// commit has not made its event consumable yet: the upstream client ends
// the half with a oneway END_TRANSACTION (or leaves it to the broker's
// check), so a marker sent right after may be stored first. The bound
// only stops a failed run.
func (f *faultBed) awaitArrival(t *testing.T, ids ...string) {
	t.Helper()
	start := time.Now()
	arrived := f.coll.WaitUntil(2*time.Minute, func(s testenv.Snapshot) bool {
		for _, id := range ids {
			if s.Counts[id] == 0 {
				return false
			}
		}
		return true
	})
	require.True(t, arrived, "the committed events %v arrived at the collector (saw %v)", ids, f.coll.Snapshot().Counts)
	t.Logf("%v at the collector %s after the wait began", ids, time.Since(start).Round(10*time.Millisecond))
}

// requireOnce asserts, on a settled collector, that id was stored exactly
// once (redeliveries of that one message after a broker restart are the
// consumer's to absorb, and are only reported).
func (f *faultBed) requireOnce(t *testing.T, s testenv.Snapshot, id string) {
	t.Helper()
	require.Positive(t, s.Counts[id], "%s: the committed event never arrived", id)
	require.Equal(t, 1, f.coll.Stored()[id], "%s: the committed event was stored more than once: %s", id, testenv.Describe(f.coll.Message(id)))
	if s.Counts[id] > 1 {
		t.Logf("%s: stored once, delivered %d times (redelivered after a restart)", id, s.Counts[id])
	}
}

// requireNever asserts, on a settled collector, that id never arrived.
func (f *faultBed) requireNever(t *testing.T, s testenv.Snapshot, id string) {
	t.Helper()
	require.Zero(t, s.Counts[id], "%s: a rolled-back or failed event arrived: %s", id, testenv.Describe(f.coll.Message(id)))
}

// The private broker runs on the test bed's broker.conf, as generated by
// services.sh: its op batch interval is below its transactionTimeOut, and
// Start says nothing about re-stores. (The op-batch warning itself is
// tested in TestStartWarnsAboutOpBatching and TestOpBatchWarning.)
func (f *faultBed) testSettings(t *testing.T) {
	conf := f.broker.settings(t)
	timeout, err := strconv.Atoi(conf["transactionTimeOut"])
	require.NoError(t, err)
	batch, err := strconv.Atoi(conf["transactionOpBatchInterval"])
	require.NoError(t, err)
	require.Less(t, batch, timeout, "the test bed's broker writes op records before it checks: %v", conf)

	l, hook := captureLogger()
	cfg := f.config()
	cfg.Group, cfg.Logger = testenv.Name(t, "pg"), l
	startProducer(t, cfg)
	for _, e := range hook.AllEntries() {
		require.False(t, e.Level <= logrus.WarnLevel && strings.Contains(e.Message, "transactionOpBatchInterval"),
			"no op-batch warning on the test bed: %s", e.Message)
	}
}

// The broker is frozen while a Send waits for its half, for twice
// LocalTxTimeout, then thawed: the half is stored late and the local
// transaction still gets its whole LocalTxTimeout (it used to start at
// BEGIN, which overlaps the half's send, so the caller's function got an
// expired context and the Send reported ErrLocalTx, "do not retry").
func (f *faultBed) testHalfStoredLate(t *testing.T) {
	cfg := f.config()
	cfg.Group = testenv.Name(t, "pg")
	cfg.LocalTxTimeout = time.Second
	cfg.SendTimeout = 20 * time.Second // longer than the freeze: the first attempt stores the half
	cfg.SendRetries = -1
	id := "late-half-" + testenv.RandSuffix(6)
	begun := make(chan struct{})
	cfg.Test.BeforeLocalTx = func(_ context.Context, eventID string) {
		if eventID == id {
			close(begun)
		}
	}
	p := startProducer(t, cfg)
	freeze := 2 * cfg.LocalTxTimeout
	wait, err := strconv.Atoi(f.broker.settings(t)["waitTimeMillsInSendQueue"])
	require.NoError(t, err)
	require.Greater(t, time.Duration(wait)*time.Millisecond, freeze,
		"the broker holds the queued half through the freeze instead of failing it fast as busy")

	f.broker.freeze(t)
	type outcome struct {
		res txproducer.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := p.Send(context.Background(), f.msg(id), insertOrder(id))
		done <- outcome{res, err}
	}()
	select {
	case <-begun:
	case <-time.After(30 * time.Second):
		f.broker.thaw(t)
		t.Fatal("the Send did not begin its local transaction")
	}
	// The broker stays frozen for twice LocalTxTimeout: this elapsed time is
	// the fault under test, not a wait for a condition.
	time.Sleep(freeze)
	f.broker.thaw(t)

	var o outcome
	select {
	case o = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the Send did not return after the broker was thawed")
	}
	require.NoError(t, o.err, "the broker's delay is not charged to the local transaction (advice: %s)", txproducer.RetryAdvice(o.err))
	require.Equal(t, txproducer.StateCommitted, o.res.State)
	require.Equal(t, txlog.StateCommitted, f.row(t, id).State)
	var orders int
	require.NoError(t, f.db.Get(&orders, f.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	require.Equal(t, 1, orders)
	f.awaitArrival(t, id)
	f.requireOnce(t, f.settle(t), id)
}

// The broker is frozen while a Send waits for its half, then killed: the
// half is never stored. The Send reports ErrSend, to be retried with a new
// event id, and nothing was committed: no txlog row, no business row, and
// the restarted broker holds no half of the event.
func (f *faultBed) testHalfNeverStored(t *testing.T) {
	cfg := f.config()
	cfg.Group = testenv.Name(t, "pg")
	cfg.LocalTxTimeout = time.Second
	cfg.SendTimeout = 3 * time.Second
	id := "no-half-" + testenv.RandSuffix(6)
	begun := make(chan struct{})
	cfg.Test.BeforeLocalTx = func(_ context.Context, eventID string) {
		if eventID == id {
			close(begun)
		}
	}
	p := startProducer(t, cfg)

	f.broker.freeze(t)
	f.requireStopped(t)
	ran := false
	done := make(chan error, 1)
	var res txproducer.Result
	go func() {
		var err error
		res, err = p.Send(context.Background(), f.msg(id), func(context.Context, *sqlx.Tx) error { ran = true; return nil })
		done <- err
	}()
	select {
	case <-begun:
	case <-time.After(30 * time.Second):
		f.broker.thaw(t)
		t.Fatal("the Send did not begin its local transaction")
	}
	f.broker.kill9(t)
	var err error
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the Send did not return after the broker was killed")
	}
	// A nil error means the client stored a half somewhere after all (the
	// local transaction runs only after a stored half): name it.
	require.ErrorIs(t, err, txproducer.ErrSend, "Send returned %+v (caller's function ran: %v)", res, ran)
	require.NotErrorIs(t, err, txproducer.ErrLocalTx)
	require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err), "%v", err)
	require.Equal(t, txproducer.StateRolledBack, res.State)
	require.False(t, ran, "the caller's function must not run without a stored half")
	_, gerr := f.store.Get(context.Background(), id)
	require.ErrorIs(t, gerr, txlog.ErrNotFound, "the early transaction's row was rolled back")
	var orders int
	require.NoError(t, f.db.Get(&orders, f.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	require.Zero(t, orders)

	f.broker.restart(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	halves, qerr := inspect.RemotingLookup{Brokers: []string{f.broker.Addr}}.QueryByKey(ctx, inspect.HalfTopic, id, 8)
	require.NoError(t, qerr)
	require.Empty(t, halves, "the killed broker never stored the half")
	f.requireNever(t, f.settle(t), id)
}

// Halves are stored, their Sends held inside the local transaction; the
// broker is killed, the transactions end (two commit, two roll back; their
// END_TRANSACTION is lost with the broker), and the broker restarts with
// the four halves pending. The producer, with the default
// BrokerWatchInterval, learns of the kill from its idle connection to the
// broker, dials it every 100 ms and registers at the first accepted
// connection, so the broker's checks reach it and every half is answered by
// a check from the txlog before the broker gives up on it (the client's own
// heartbeat, every 30 s, used to leave the broker without a channel for the
// group until the short test settings discarded them). The raw collector
// judges: both commits arrive, neither rollback arrives, and no half
// reaches the broker's discard topic or discard recovery. Each commit is
// stored at least once and at most once per COMMIT answer this producer
// gave to a check of it: every store here comes from a check, since the
// Sends' own ENDs went to a dead broker. A broker that restarted slowly may
// check a half again before it has read the op record of the commit it just
// stored (seen once, on a 2-core VM: a second check 4 s after the first),
// and it stores that commit again; the answer, from the same txlog row, is
// the same, and the copy is the consumer's dedup to absorb. How long the
// checks took and any second store are reported.
func (f *faultBed) testRestartWithPendingHalves(t *testing.T) {
	conf := f.broker.settings(t)
	interval, err := strconv.Atoi(conf["transactionCheckInterval"])
	require.NoError(t, err)
	checkMax, err := strconv.Atoi(conf["transactionCheckMax"])
	require.NoError(t, err)
	checkInterval := time.Duration(interval) * time.Millisecond

	// The producer's check answers, for the report only: the collector
	// decides the outcome.
	var mu sync.Mutex
	answeredAt := map[string]time.Time{} // first COMMIT or ROLLBACK per event
	commits := map[string]int{}          // COMMIT answers per event
	cfg := f.config()
	cfg.Group = testenv.Name(t, "pg")
	cfg.Logger = testLogger(t)
	cfg.DisableRecovery, cfg.RecoveryStartRetry = false, time.Second
	cfg.OnCheck = func(a checkback.Answer) {
		mu.Lock()
		defer mu.Unlock()
		t.Logf("check answered: %s %s (%s, half age %s)", a.EventID, a.Decision, a.Reason, a.Age.Round(time.Millisecond))
		if _, ok := answeredAt[a.EventID]; !ok && (a.Decision == checkback.Commit || a.Decision == checkback.Rollback) {
			answeredAt[a.EventID] = time.Now()
		}
		if a.Decision == checkback.Commit {
			commits[a.EventID]++
		}
	}
	p := startProducer(t, cfg)

	const n = 4
	entered := make(chan string, n)
	release := make(chan struct{})
	ids := make([]string, n)
	results := make([]error, n)
	var committed, rolledBack []string
	var wg sync.WaitGroup
	for i := range ids {
		ids[i] = "pending-" + strconv.Itoa(i) + "-" + testenv.RandSuffix(6)
		if i%2 == 1 {
			rolledBack = append(rolledBack, ids[i])
		} else {
			committed = append(committed, ids[i])
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			id := ids[i]
			_, results[i] = p.Send(context.Background(), f.msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
				// The caller's function runs only once the half is stored.
				entered <- id
				<-release
				if err := insertOrder(id)(ctx, tx); err != nil {
					return err
				}
				if i%2 == 1 {
					return errBusiness
				}
				return nil
			})
		}(i)
	}
	for range ids {
		select {
		case <-entered:
		case <-time.After(30 * time.Second):
			close(release)
			t.Fatal("the Sends' halves were not stored")
		}
	}
	f.broker.kill9(t)
	close(release)
	wg.Wait()
	for i, err := range results {
		if i%2 == 1 {
			require.ErrorIs(t, err, errBusiness)
		} else {
			require.NoError(t, err)
		}
	}
	// Nothing of them is consumable yet: the halves are pending, their
	// ends lost with the broker.
	for _, id := range ids {
		require.Zero(t, f.coll.Snapshot().Counts[id], "%s arrived before the broker checked its half", id)
	}

	began := time.Now()
	usable := f.broker.restart(t)
	// The broker gives up on a half after transactionCheckMax unanswered
	// checks, one interval apart; a commit not answered by then never
	// arrives. The wait ends when the commits arrive (the collector's client
	// may need a route refresh and a rebalance to pull from the restarted
	// broker again: tens of seconds).
	discardBy := usable.Add(time.Duration(checkMax+1) * checkInterval)
	f.awaitArrival(t, committed...)
	t.Logf("the commits at the collector %s after the broker was usable (check interval %s, max %d checks)",
		time.Since(usable).Round(10*time.Millisecond), checkInterval, checkMax)
	// Every half is decided by a check this producer answered: the rollbacks
	// too (the broker checks them until an answer, or gives up).
	testenv.Eventually(t, time.Duration(checkMax+2)*checkInterval, "a check answered for every pending half", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if _, ok := answeredAt[id]; !ok {
				return false
			}
		}
		return true
	})
	mu.Lock()
	for _, id := range ids {
		t.Logf("%s: the producer answered its check %s after the broker's restart began (usable after %s)", id,
			answeredAt[id].Sub(began).Round(10*time.Millisecond), usable.Sub(began).Round(10*time.Millisecond))
	}
	mu.Unlock()

	// No half reaches discard: the broker would discard an unanswered half
	// after transactionCheckMax checks. Watch the txlog's recovery columns
	// until then (and one interval more; recovery runs with the producer):
	// the window is the fault's, no condition ends it sooner. Then ask the
	// broker itself whether it moved any of the halves to its discard topic.
	recovered := func() int {
		yes := true
		n, err := f.store.Count(context.Background(), txlog.Filter{Recovered: &yes})
		require.NoError(t, err)
		return n
	}
	for time.Now().Before(discardBy) {
		require.Zero(t, recovered(), "no half reaches discard recovery")
		time.Sleep(250 * time.Millisecond)
	}
	require.Zero(t, recovered(), "no half reaches discard recovery")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, id := range ids {
		ms, err := inspect.RemotingLookup{Brokers: []string{f.broker.Addr}}.QueryByKey(ctx, inspect.DiscardTopic, id, 8)
		if err != nil && !errors.Is(err, inspect.ErrTopicNotFound) {
			require.NoError(t, err)
		}
		require.Empty(t, ms, "%s: the broker discarded a half", id)
	}

	// Every half has been checked and decided (or discarded, just ruled
	// out) by now: a rollback the broker had committed would be on the
	// queue before the marker.
	s := f.settle(t)
	mu.Lock()
	defer mu.Unlock()
	stored := f.coll.Stored()
	for _, id := range committed {
		require.Positive(t, s.Counts[id], "%s: the committed event never arrived", id)
		require.Positive(t, commits[id], "%s: stored, yet no check of it was answered COMMIT", id)
		require.LessOrEqual(t, stored[id], commits[id],
			"%s: stored more often than this producer answered COMMIT to a check of it: %s", id, testenv.Describe(f.coll.Message(id)))
		if stored[id] > 1 {
			t.Logf("%s: stored %d times after %d COMMIT answers to checks of it (the broker checked it again after storing an earlier commit)",
				id, stored[id], commits[id])
		}
	}
	for _, id := range rolledBack {
		require.Zero(t, commits[id], "%s: a check of a rolled-back event was answered COMMIT", id)
		f.requireNever(t, s, id)
	}
}
