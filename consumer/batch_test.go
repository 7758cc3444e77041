package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

func newIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = wire.NewEventID()
	}
	return ids
}

func batchOfMsgs(ids []string, typ string) []Message {
	out := make([]Message, len(ids))
	for i, id := range ids {
		out[i] = msg(ev(id, typ), fmt.Sprintf(`{"i":%d}`, i))
	}
	return out
}

func results(outs []Outcome) []Result {
	r := make([]Result, len(outs))
	for i, o := range outs {
		r[i] = o.Result
	}
	return r
}

// A batch of new events costs BEGIN, one dedup INSERT for all of them, the
// handler per event, and COMMIT; crash counting (the default) adds two
// statements per batch whatever its size: one count for all the events
// before BEGIN and one DELETE of their counts in the transaction; a third,
// the read of the events whose previous attempt crashed, only when some
// events had an attempt row already (MySQL: PostgreSQL's count returns them).
func TestProcessBatchRoundTrips(t *testing.T) {
	t.Parallel()
	// MariaDB only, as TestProcessRoundTrips: counted with the server's
	// session counters. PostgreSQL runs the same statements but the read.
	db := setupDB(t, testenv.MySQLDB(t))
	one, m := singleConn(t, db)
	p := newProc(t, one, func(c *ProcessorConfig) {
		c.Routes = map[string]Route{"Created": {Handler: preparedHandler(t, one)}}
		c.DedupCacheSize = -1
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 16
	runIDs := func(ids []string) error {
		for _, o := range p.ProcessBatch(ctx, batchOfMsgs(ids, "Created")) {
			if o.Result != ResultApplied {
				return fmt.Errorf("%s %v", o.Result, o.Err)
			}
		}
		return nil
	}
	run := func() error { return runIDs(newIDs(n)) }
	require.NoError(t, run())
	testenv.Eventually(t, 10*time.Second, "statements prepared", func() bool {
		c, err := m.Measure(ctx, run)
		return err == nil && c.Prepare == 0
	})
	c, err := m.Measure(ctx, run)
	require.NoError(t, err)
	t.Logf("batch of %d first deliveries, counted: %s (%.2f round trips per event; single mode: 6)", n, c, float64(c.RoundTrips())/n)
	require.EqualValues(t, 5+n, c.RoundTrips(), "count, BEGIN, dedup INSERT, the handler per event, DELETE of the counts, COMMIT")
	require.Zero(t, c.Savepoint, "no savepoint while every event succeeds")
	require.EqualValues(t, 1, c.Commit)
	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt"), "the counts deleted with the commit")

	// Events that failed before (an attempt row each, none a crash): the
	// read of the crashed ones comes on top, still one for the batch.
	warm, ids := newIDs(n), newIDs(n)
	for _, id := range append([]string{warm[0]}, ids...) {
		exec(t, db, "INSERT INTO rmqtx_consume_attempt (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at)"+
			" VALUES (?, ?, 1, 'transient', 'earlier', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", p.Config().Group, id)
	}
	require.NoError(t, runIDs(warm)) // the read's statement prepared
	c, err = m.Measure(ctx, func() error { return runIDs(ids) })
	require.NoError(t, err)
	t.Logf("batch of %d events with earlier attempts, counted: %s", n, c)
	require.EqualValues(t, 6+n, c.RoundTrips(), "count, read of the crashed, BEGIN, dedup INSERT, the handlers, DELETE, COMMIT")
	require.Zero(t, c.Prepare)
	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt"), "the counts deleted with the commit")

	// Without crash counting: none of the three.
	p.cfg.NoCrashCount = true
	require.NoError(t, run())
	c, err = m.Measure(ctx, run)
	require.NoError(t, err)
	t.Logf("batch of %d first deliveries, NoCrashCount: %s (%.2f round trips per event; single mode: 4)", n, c, float64(c.RoundTrips())/n)
	require.EqualValues(t, 3+n, c.RoundTrips(), "BEGIN, dedup INSERT, the handler per event, COMMIT")

	// With a savepoint per event from the start: one more round trip each.
	p.batchQueries.savepointsAlways = true
	require.NoError(t, run())
	c, err = m.Measure(ctx, run)
	require.NoError(t, err)
	t.Logf("the same with a SAVEPOINT per event: %s (%.2f round trips per event)", c, float64(c.RoundTrips())/n)
	require.EqualValues(t, 3+2*n, c.RoundTrips(), "BEGIN, dedup INSERT, SAVEPOINT+handler per event, COMMIT")
	require.EqualValues(t, n, c.Savepoint)
	p.batchQueries.savepointsAlways = false
	require.EqualValues(t, p.Stats().Applied, effects(t, db))
}

// A failing event rolls back alone: its neighbours commit, it is retried
// (transient) or parked (permanent) on its own, and its redelivery applies
// it once.
func TestProcessBatchFailingEventRollsBackAlone(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessBatchFailingEventRollsBackAlone)
}

func testProcessBatchFailingEventRollsBackAlone(t *testing.T, db *sqlx.DB) {
	ids := newIDs(8)
	failOnce := map[string]error{
		ids[2]: errors.New("connection reset by peer"), // unclassified: retried
		ids[5]: BadData(errors.New("amount is negative")),
	}
	var mu sync.Mutex
	runs := map[string]int{}
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Routes = map[string]Route{"Created": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			if err := effectHandler(ctx, tx, ev); err != nil {
				return err
			}
			mu.Lock()
			runs[ev.ID]++
			run := runs[ev.ID]
			err := failOnce[ev.ID]
			delete(failOnce, ev.ID)
			mu.Unlock()
			// The reference of the run that commits is the one recorded.
			if rerr := ev.SetResultRef(fmt.Sprintf("run %d", run)); rerr != nil {
				return rerr
			}
			return err // after its INSERT: the savepoint must undo it
		}}}
	})
	ctx := context.Background()
	outs := p.ProcessBatch(ctx, batchOfMsgs(ids, "Created"))
	want := []Result{ResultApplied, ResultApplied, ResultRetry, ResultApplied, ResultApplied, ResultParked, ResultApplied, ResultApplied}
	require.Equal(t, want, results(outs))
	require.Equal(t, ClassData, outs[5].Class)
	require.Equal(t, 6, effects(t, db), "the two failed events left no effect")
	for i, id := range ids {
		n := countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", id)
		d := countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE event_id = ?", id)
		if i == 2 || i == 5 {
			require.Zero(t, n, "event %d", i)
			require.Zero(t, d, "event %d: no dedup row for a rolled-back event", i)
		} else {
			require.Equal(t, 1, n, "event %d", i)
			require.Equal(t, 1, d, "event %d", i)
		}
	}
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE event_id = ?", ids[2]))
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter WHERE event_id = ?", ids[5]))

	// The redelivery of the whole batch (the client re-delivers what was
	// not ACKed; here all of it): the retried event applies, the rest are
	// duplicates, nothing runs twice.
	again := batchOfMsgs(ids, "Created")
	for i := range again {
		again[i].Delivery.ReconsumeTimes = 1
	}
	outs = p.ProcessBatch(ctx, []Message{again[2], again[0], again[1]})
	require.Equal(t, []Result{ResultApplied, ResultDuplicate, ResultDuplicate}, results(outs))
	require.Equal(t, 7, effects(t, db))
	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE event_id = ?", ids[2]), "the success clears the attempts")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 2, runs[ids[2]], "failed once (not run again in the second pass), applied once")
	require.Equal(t, 1, runs[ids[5]], "failed in the second pass, rolled back to its savepoint")
	// The first pass ran events 0 and 1, then 2 failed and the pass was
	// rolled back; the second pass ran them again (committed once).
	require.Equal(t, 2, runs[ids[0]])
	require.Equal(t, 2, runs[ids[1]])
	require.Equal(t, 1, runs[ids[3]])
	for i, want := range map[int]string{0: "run 2", 1: "run 2", 2: "run 2", 3: "run 1", 7: "run 1"} {
		var ref string
		require.NoError(t, db.Get(&ref, db.Rebind("SELECT result_ref FROM rmqtx_consume_log WHERE event_id = ?"), ids[i]))
		require.Equal(t, want, ref, "event %d", i)
	}
}

// Duplicates in a batch, decided by the database: all known (one locking
// read), mixed with new ones (decided one by one), a conflicting hash
// (parked), and the same event twice in one batch (applied once).
func TestProcessBatchDuplicatesAndConflicts(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessBatchDuplicatesAndConflicts)
}

func testProcessBatchDuplicatesAndConflicts(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, func(c *ProcessorConfig) { c.DedupCacheSize = -1 })
	ctx := context.Background()
	old := newIDs(4)
	require.Equal(t, []Result{ResultApplied, ResultApplied, ResultApplied, ResultApplied}, results(p.ProcessBatch(ctx, batchOfMsgs(old, "Created"))))

	// All known: duplicates, no effect.
	require.Equal(t, []Result{ResultDuplicate, ResultDuplicate, ResultDuplicate, ResultDuplicate},
		results(p.ProcessBatch(ctx, batchOfMsgs(old, "Created"))))
	require.Equal(t, 4, effects(t, db))

	// Mixed: two known, one known with another payload, two new, one new
	// twice.
	fresh := newIDs(3)
	batch := batchOfMsgs(old[:2], "Created")
	batch = append(batch, msg(ev(old[2], "Created"), `{"other":"payload"}`))
	batch = append(batch, batchOfMsgs(fresh, "Created")...)
	batch = append(batch, batch[len(batch)-1]) // fresh[2] again
	outs := p.ProcessBatch(ctx, batch)
	require.Equal(t, []Result{ResultDuplicate, ResultDuplicate, ResultConflict, ResultApplied, ResultApplied, ResultApplied, ResultDuplicate}, results(outs))
	require.Equal(t, 7, effects(t, db))
	for _, id := range append(old, fresh...) {
		require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", id), id)
	}
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter WHERE event_id = ? AND error_class = 'conflict'", old[2]))
	s := p.Stats()
	require.EqualValues(t, 7, s.Applied)
	require.EqualValues(t, 7, s.Duplicates)
	require.EqualValues(t, 1, s.Conflicts)
}

// The version guard runs per event in order inside the batch: consecutive
// versions of one aggregate apply in one batch, a version after a failed one
// waits (a gap), and an older one is stale.
func TestProcessBatchVersionOrder(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessBatchVersionOrder)
}

func testProcessBatchVersionOrder(t *testing.T, db *sqlx.DB) {
	var mu sync.Mutex
	failVersion := map[int64]bool{5: true}
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Routes = map[string]Route{"Moved": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			mu.Lock()
			fail := failVersion[ev.AggregateVersion]
			delete(failVersion, ev.AggregateVersion)
			mu.Unlock()
			if fail {
				return Transient(errors.New("downstream busy"))
			}
			return effectHandler(ctx, tx, ev)
		}}}
	})
	ctx := context.Background()
	agg := "box-" + testenv.RandSuffix(6)
	mk := func(v int64) Message { return msg(aggEv(wire.NewEventID(), agg, v), fmt.Sprintf(`{"v":%d}`, v)) }
	b1 := []Message{mk(1), mk(2), mk(3)}
	require.Equal(t, []Result{ResultApplied, ResultApplied, ResultApplied}, results(p.ProcessBatch(ctx, b1)))

	// 5 before 4 (strict: a gap), 4, then 5 again fails in its handler, 6
	// waits for it.
	v5, v4, v6 := mk(5), mk(4), mk(6)
	outs := p.ProcessBatch(ctx, []Message{v5, v4, v6})
	require.Equal(t, []Result{ResultRetry, ResultApplied, ResultRetry}, results(outs))
	require.ErrorIs(t, outs[0].Err, ErrVersionGap)
	require.ErrorIs(t, outs[2].Err, ErrVersionGap)

	v5.Delivery.ReconsumeTimes, v6.Delivery.ReconsumeTimes = 1, 1
	outs = p.ProcessBatch(ctx, []Message{v5, v6})
	require.Equal(t, []Result{ResultRetry, ResultRetry}, results(outs), "5's handler fails once; 6 waits for it")
	require.NotErrorIs(t, outs[0].Err, ErrVersionGap)
	require.ErrorIs(t, outs[1].Err, ErrVersionGap)

	v5.Delivery.ReconsumeTimes, v6.Delivery.ReconsumeTimes = 2, 2
	require.Equal(t, []Result{ResultApplied, ResultApplied}, results(p.ProcessBatch(ctx, []Message{v5, v6})))
	require.Equal(t, []Result{ResultStale}, results(p.ProcessBatch(ctx, []Message{mk(2)}))[:1])

	var versions []int64
	require.NoError(t, db.Select(&versions, db.Rebind("SELECT version FROM effect WHERE agg_id = ? ORDER BY id"), agg))
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, versions, "applied once each, in version order")
}

// Batch mode on the real broker: every event applied exactly once although
// some fail on their first attempt (re-sent to the retry topic alone while
// their neighbours commit); the topic holds one copy of each (an
// independent collector counts them).
func TestBatchModeOnBroker(t *testing.T) {
	t.Parallel()
	eachDB(t, testBatchModeOnBroker)
}

func testBatchModeOnBroker(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 2)
	col := testenv.Collect(t, topic)
	const n = 120
	ids := newIDs(n)
	failFirst := map[string]bool{}
	for i := 0; i < n; i += 10 {
		failFirst[ids[i]] = true
	}
	// The events wait on the topic before the group starts (from the first
	// offset), so the client hands them over in batches whatever the
	// machine's speed: published one by one to a running consumer, they
	// may each arrive alone.
	pub := newPublisher(t)
	for i, id := range ids {
		pub.send(topic, ev(id, "Created"), fmt.Appendf(nil, `{"i":%d}`, i))
	}
	var mu sync.Mutex
	txs := map[*sqlx.Tx]int{} // events per transaction
	runs := &runCounter{}
	c := startConsumer(t, db, topic, group, map[string]Route{"Created": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
		if err := effectHandler(ctx, tx, ev); err != nil {
			return err
		}
		mu.Lock()
		txs[tx]++
		mu.Unlock()
		if runs.add(ev.ID) == 1 && failFirst[ev.ID] {
			return Transient(errors.New("first attempt fails"))
		}
		return nil
	}}}, func(cfg *Config) {
		cfg.BatchTransaction = true
		cfg.Goroutines = 4
	})
	require.Equal(t, DefaultBatchTxSize, c.Config().BatchSize)
	testenv.Eventually(t, 2*time.Minute, "every event applied", func() bool {
		return c.Processor().Stats().Applied >= n
	})
	snap := col.WaitDistinct(t, n, time.Minute)
	for _, id := range ids {
		require.Equal(t, 1, snap.Counts[id], "one copy of %s on the topic", id)
		require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", id), "one effect of %s", id)
	}
	s := c.Processor().Stats()
	require.EqualValues(t, n, s.Applied)
	require.EqualValues(t, n/10, s.Retries)
	require.Equal(t, n, effects(t, db))
	mu.Lock()
	shared, largest := 0, 0
	for _, k := range txs {
		if k > 1 {
			shared++
		}
		largest = max(largest, k)
	}
	mu.Unlock()
	require.Positive(t, shared, "events shared transactions")
	t.Logf("batch mode on the broker: %d events, %d failed first, applied %d, retries %d, duplicates %d; %d transactions (%d shared, largest %d events); topic copies %d",
		n, len(failFirst), s.Applied, s.Retries, s.Duplicates, len(txs), shared, largest, snap.Total)
}
