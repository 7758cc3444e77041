package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

func heldQueries(t *testing.T, b *bed) queries {
	t.Helper()
	q := newQueries(dialect.Must(b.db), b.table.Name())
	q.stmts = stmtcache.New(b.db)
	t.Cleanup(q.stmts.Close)
	return q
}

// A held claim writes nothing until its outcomes: the rows stay PENDING to
// every reader while it holds them. Another claim passes them over at once
// (SKIP LOCKED, no wait), and an aggregate's next version is no head while
// its predecessor is held. The outcome commits with one write per row, and
// the session's own idle limit is restored on the pooled connection.
func TestHeldClaimLocksWithoutWriting(t *testing.T) {
	t.Parallel()
	eachDB(t, testHeldClaimLocksWithoutWriting)
}

func testHeldClaimLocksWithoutWriting(t *testing.T, b *bed) {
	ctx := context.Background()
	q := heldQueries(t, b)
	agg := []Event{
		{EventType: "Changed", AggregateType: "Acc", AggregateID: "a1", AggregateVersion: 1, Destination: "t", Payload: []byte("1")},
		{EventType: "Changed", AggregateType: "Acc", AggregateID: "a1", AggregateVersion: 2, Destination: "t", Payload: []byte("2")},
	}
	aggIDs := b.enqueue(t, agg...)
	free := b.enqueue(t, events("t", 3)...)

	// A takes v1 and the three keyless rows.
	a, err := q.claimHeld(ctx, b.db, "A.1", 10, time.Minute, time.Minute, allSteps, nil)
	require.NoError(t, err)
	require.NotNil(t, a.hold)
	require.ElementsMatch(t, append([]string{aggIDs[0]}, free...), claimedIDs(a.rows))
	require.Equal(t, map[Status]int{StatusPending: 5}, b.counts(t), "held rows are not written")

	// B passes A's rows over without waiting for them, and v2 is no head.
	bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	bres, err := q.claimHeld(bctx, b.db, "B.1", 10, time.Minute, time.Minute, allSteps, nil)
	cancel()
	require.NoError(t, err, "a claim never waits for a held row")
	require.Empty(t, bres.rows)
	require.Nil(t, bres.hold)

	// A's outcomes: SENT for v1 and two rows, RETRY for the third.
	require.NoError(t, a.hold.markSent("A.1", []string{aggIDs[0], free[0], free[1]}))
	var third claimedRow
	for _, r := range a.rows {
		if r.EventID == free[2] {
			third = r
		}
	}
	require.NoError(t, a.hold.markFailed(third, false, time.Hour, "transient", "later"))
	require.NoError(t, a.hold.commit())
	a.hold.end()
	require.Equal(t, map[Status]int{StatusSent: 3, StatusRetry: 1, StatusPending: 1}, b.counts(t))
	row, err := b.table.Get(ctx, b.db, free[2])
	require.NoError(t, err)
	require.Equal(t, 1, row.RetryCount)
	require.Equal(t, "A.1", row.OwnerToken)
	row, err = b.table.Get(ctx, b.db, free[0])
	require.NoError(t, err)
	require.Equal(t, "A.1", row.OwnerToken, "the SENT row names the claim that sent it")
	require.False(t, row.SentAt.IsZero())

	// v1 is SENT: v2 is the head now.
	c, err := q.claimHeld(ctx, b.db, "C.1", 10, time.Minute, time.Minute, allSteps, nil)
	require.NoError(t, err)
	require.Equal(t, []string{aggIDs[1]}, claimedIDs(c.rows))
	c.hold.end() // rolled back: v2 stays PENDING, unwritten
	require.Equal(t, map[Status]int{StatusSent: 3, StatusRetry: 1, StatusPending: 1}, b.counts(t))
}

// The claim's idle limit holds while it is open and is undone before the
// connection goes back to the pool (a pool of one, so the next statement
// runs on that very connection).
func TestHeldClaimRestoresIdleLimit(t *testing.T) {
	t.Parallel()
	eachDB(t, testHeldClaimRestoresIdleLimit)
}

func testHeldClaimRestoresIdleLimit(t *testing.T, b *bed) {
	ctx := context.Background()
	one := testenv.Reopen(t, b.db)
	one.SetMaxOpenConns(1)
	q := newQueries(dialect.Must(one), b.table.Name()) // unprepared: no second connection needed
	// The session setting that bounds an idle claim, and its value for 7s:
	// MariaDB's wait_timeout in seconds, PostgreSQL's
	// idle_in_transaction_session_timeout (set LOCAL to the transaction).
	limit, want := "SELECT CAST(@@SESSION.wait_timeout AS CHAR)", "7"
	if one.DriverName() != "mysql" {
		limit, want = "SELECT current_setting('idle_in_transaction_session_timeout')", "7s"
	}
	var before string
	require.NoError(t, one.Get(&before, limit))
	require.NotEqual(t, want, before)
	b.enqueue(t, events("t", 2)...)
	for _, commit := range []bool{true, false} {
		res, err := q.claimHeld(ctx, one, "R.1", 10, time.Minute, 7*time.Second, allSteps, nil)
		require.NoError(t, err)
		require.NotEmpty(t, res.rows)
		var during string
		require.NoError(t, res.hold.tx.Get(&during, limit))
		require.Equal(t, want, during)
		if commit {
			require.NoError(t, res.hold.markSent("R.1", claimedIDs(res.rows[:1])))
			require.NoError(t, res.hold.commit())
		}
		res.hold.end()
		var after string
		require.NoError(t, one.Get(&after, limit))
		require.Equal(t, before, after, "commit %v: the pooled connection kept the claim's idle limit", commit)
	}
	require.Equal(t, map[Status]int{StatusSent: 1, StatusPending: 1}, b.counts(t))
}

// A zombie: A holds a claim and stops issuing statements (paused,
// partitioned: its client-side deadline is not running). The server ends
// its session after the idle limit and rolls the claim back; B then claims
// the rows and records them; A's late outcome fails and changes nothing.
func TestHeldClaimZombie(t *testing.T) {
	t.Parallel()
	eachDB(t, testHeldClaimZombie)
}

func testHeldClaimZombie(t *testing.T, b *bed) {
	ctx := context.Background()
	q := heldQueries(t, b)
	ids := b.enqueue(t, events("t", 3)...)

	// The zombie's own deadline is an hour away: only the server's idle
	// limit (1s) can end its claim.
	a, err := q.claimHeld(ctx, b.db, "A.1", 10, time.Hour, time.Second, allSteps, nil)
	require.NoError(t, err)
	require.Len(t, a.rows, 3)

	var got claimResult
	testenv.Eventually(t, 30*time.Second, "the server to end the idle zombie's claim", func() bool {
		got, err = q.claimHeld(ctx, b.db, "B.1", 10, time.Minute, time.Minute, allSteps, nil)
		require.NoError(t, err)
		return len(got.rows) > 0
	})
	require.ElementsMatch(t, ids, claimedIDs(got.rows))
	for _, r := range got.rows {
		require.False(t, r.tookOver, "the rows were PENDING, not SENDING")
	}
	require.NoError(t, got.hold.markSent("B.1", ids))
	require.NoError(t, got.hold.commit())
	got.hold.end()

	// A wakes up: its outcome and its commit fail; B's stand.
	err = a.hold.markSent("A.1", ids)
	if err == nil {
		err = a.hold.commit()
	}
	require.Error(t, err, "the zombie's late outcome must not land")
	a.hold.end()
	for _, id := range ids {
		row, err := b.table.Get(ctx, b.db, id)
		require.NoError(t, err)
		require.Equal(t, StatusSent, row.Status)
		require.Equal(t, "B.1", row.OwnerToken)
	}
	t.Logf("zombie: A held 3 rows and went idle; the server ended its session, B claimed and sent them, A's late outcome failed (%v)", err)
}

// rowWrites counts, per event id, the UPDATEs of b's outbox table from now
// on (a trigger logs each one).
func rowWrites(t *testing.T, b *bed) func() map[string][]string {
	t.Helper()
	log := b.table.Name() + "_writes"
	stmts := []string{
		"CREATE TABLE " + log + " (n BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL)",
		"CREATE TRIGGER " + log + "_tr AFTER UPDATE ON " + b.table.Name() +
			" FOR EACH ROW INSERT INTO " + log + " (event_id, status) VALUES (NEW.event_id, NEW.status)",
	}
	if b.db.DriverName() != "mysql" {
		stmts = []string{
			"CREATE TABLE " + log + " (n BIGSERIAL PRIMARY KEY, event_id VARCHAR(64) NOT NULL, status VARCHAR(16) NOT NULL)",
			"CREATE FUNCTION " + log + "_fn() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO " + log +
				" (event_id, status) VALUES (NEW.event_id, NEW.status); RETURN NULL; END $$",
			"CREATE TRIGGER " + log + "_tr AFTER UPDATE ON " + b.table.Name() + " FOR EACH ROW EXECUTE FUNCTION " + log + "_fn()",
		}
	}
	for _, q := range stmts {
		_, err := b.db.Exec(q)
		require.NoError(t, err)
	}
	return func() map[string][]string {
		var rows []struct {
			ID     string `db:"event_id"`
			Status string `db:"status"`
		}
		require.NoError(t, b.db.Select(&rows, "SELECT event_id, status FROM "+log+" ORDER BY n"))
		out := map[string][]string{}
		for _, r := range rows {
			out[r.ID] = append(out[r.ID], r.Status)
		}
		return out
	}
}

// One write per row: a dispatcher with a batch sink writes each row once
// (PENDING -> SENT), one with a plain sink twice (-> SENDING -> SENT). The
// broker receives each event once either way. A failed send (a busy broker
// on a loaded machine) adds its own writes (RETRY; SENDING and RETRY), so
// every row's writes must be exactly its failed attempts' and then the
// successful one's, and most rows must have had no failed attempt.
func TestOneWritePerRowWithBatchSink(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		sent   []string // the writes of an attempt that succeeds
		failed []string // the writes of one that fails
		fails  bool     // the sink fails its first attempt
		sink   func(s *RocketMQSink) Sink
	}{
		{"batch sink (held claims)", []string{"SENT"}, []string{"RETRY"}, false, func(s *RocketMQSink) Sink { return s }},
		{"plain sink (two writes)", []string{"SENDING", "SENT"}, []string{"SENDING", "RETRY"}, false, func(s *RocketMQSink) Sink { return FuncSink(s.Send) }},
		// The first attempt fails: its rows are written RETRY, then SENT.
		{"batch sink, first batch fails", []string{"SENT"}, []string{"RETRY"}, true, func(s *RocketMQSink) Sink { return &failFirstBatch{RocketMQSink: s} }},
		{"plain sink, first send fails", []string{"SENDING", "SENT"}, []string{"SENDING", "RETRY"}, true, func(s *RocketMQSink) Sink {
			var failed atomic.Bool
			return FuncSink(func(ctx context.Context, m *Message) error {
				if failed.CompareAndSwap(false, true) {
					return Transient(errors.New("test: the first send fails"))
				}
				return s.Send(ctx, m)
			})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			eachDB(t, func(t *testing.T, b *bed) {
				topic := testenv.Name(t, "topic")
				testenv.CreateTopic(t, topic, 4)
				col := testenv.Collect(t, topic)
				const n = 300
				ids := b.enqueue(t, events(topic, n)...)
				writes := rowWrites(t, b)
				d := b.dispatcher(t, Config{Sink: c.sink(b.sink(t)), BatchSize: 64, Concurrency: 8, PollInterval: 100 * time.Millisecond})
				b.waitStatus(t, StatusSent, n, 2*time.Minute)
				snap := col.WaitDistinct(t, n, time.Minute)
				w := writes()
				var tries []struct {
					ID      string `db:"event_id"`
					Retries int    `db:"retry_count"`
				}
				require.NoError(t, b.db.Select(&tries, "SELECT event_id, retry_count FROM "+b.table.Name()))
				retries := map[string]int{}
				for _, r := range tries {
					retries[r.ID] = r.Retries
				}
				// A send that fails (a busy broker on a loaded machine)
				// writes its row RETRY, by design: the hot path is the
				// attempt that succeeds. So each row's writes are exactly
				// its failed attempts' and then one successful attempt's.
				clean := 0
				for _, id := range ids {
					require.Equal(t, 1, snap.Counts[id], "row %s delivered once", id)
					var want []string
					for range retries[id] {
						want = append(want, c.failed...)
					}
					want = append(want, c.sent...)
					require.Equal(t, want, w[id], "row %s (retry_count %d): its writes", id, retries[id])
					if retries[id] == 0 {
						clean++
					}
				}
				require.Greater(t, clean, n/2, "most rows went through on their first attempt: the proof is about them")
				if c.fails {
					require.Less(t, clean, n, "the failed first attempt left rows written RETRY")
				}
				// The table shows SENT when the outcome commits; the counter
				// follows just after (held.go counts once the commit returned).
				testenv.Eventually(t, 30*time.Second, "every SENT counted", func() bool { return d.Stats().Sent >= n })
				st := d.Stats()
				require.EqualValues(t, n, st.Sent)
				require.Zero(t, st.MarkErrors+st.LostLeases+st.TookOver)
				t.Logf("%s: %d rows, %d of them on their first attempt with %d write(s) each (%v), %d claims' worth of rows, each delivered once",
					c.name, n, clean, len(c.sent), c.sent, st.Claimed)
			})
		})
	}
}

// failFirstBatch is the RocketMQSink whose first SendBatch fails with a
// transient error for every message.
type failFirstBatch struct {
	*RocketMQSink
	failed atomic.Bool
}

func (f *failFirstBatch) SendBatch(ctx context.Context, msgs []*Message) []error {
	if f.failed.CompareAndSwap(false, true) {
		return repeat(Transient(errors.New("test: the first batch fails")), len(msgs))
	}
	return f.RocketMQSink.SendBatch(ctx, msgs)
}

// blockingBatch is a BatchSink whose sends wait for release or their
// context; entered reports each send's first row.
type blockingBatch struct {
	entered chan string
	release chan struct{}
}

func (s blockingBatch) wait(ctx context.Context, id string) error {
	s.entered <- id
	select {
	case <-s.release:
		return nil
	case <-ctx.Done():
		return Unknown(ctx.Err())
	}
}

func (s blockingBatch) Send(ctx context.Context, m *Message) error { return s.wait(ctx, m.EventID) }
func (s blockingBatch) Batches(msgs []*Message) [][]*Message       { return [][]*Message{msgs} }
func (s blockingBatch) SendBatch(ctx context.Context, msgs []*Message) []error {
	return repeat(s.wait(ctx, msgs[0].EventID), len(msgs))
}

// Shutdown of a held dispatcher: a graceful one waits for the batch in
// flight and records it SENT; one whose context ends cancels the send and
// the rows are as they were, unwritten (no owner, no retry used).
func TestShutdownHeldClaim(t *testing.T) {
	t.Parallel()
	eachDB(t, testShutdownHeldClaim)
}

func testShutdownHeldClaim(t *testing.T, b *bed) {
	sink := blockingBatch{entered: make(chan string, 10), release: make(chan struct{})}
	first := b.enqueue(t, events("cmd", 3)...)
	cfg := Config{DB: b.db, Sink: sink, Concurrency: 4, BatchSize: 8, PollInterval: 20 * time.Millisecond}

	d1, err := NewDispatcher(cfg)
	require.NoError(t, err)
	require.NoError(t, d1.Start(context.Background()))
	<-sink.entered
	done := make(chan error, 1)
	go func() { done <- d1.Shutdown(context.Background()) }()
	close(sink.release)
	require.NoError(t, <-done)
	require.Equal(t, map[Status]int{StatusSent: 3}, b.counts(t))
	require.EqualValues(t, 3, d1.Stats().Sent)

	sink.release = make(chan struct{})
	cfg.Sink = sink // never released: only Shutdown's context ends the send
	second := b.enqueue(t, events("cmd", 3)...)
	var mu sync.Mutex
	var outs []Outcome
	cfg.OnOutcome = func(o Outcome) { mu.Lock(); outs = append(outs, o); mu.Unlock() }
	d2, err := NewDispatcher(cfg)
	require.NoError(t, err)
	require.NoError(t, d2.Start(context.Background()))
	<-sink.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, d2.Shutdown(ctx), context.Canceled)
	for _, id := range second {
		row, err := b.table.Get(context.Background(), b.db, id)
		require.NoError(t, err)
		require.Equal(t, StatusPending, row.Status)
		require.Zero(t, row.RetryCount)
		require.Empty(t, row.OwnerToken, "a handed-back held row is never written")
	}
	require.EqualValues(t, 3, d2.Stats().Released)
	mu.Lock()
	require.Len(t, outs, 3)
	for _, o := range outs {
		require.Equal(t, StatusPending, o.Status)
		require.False(t, o.LostLease)
	}
	mu.Unlock()
	t.Logf("held shutdown: %d rows SENT after a graceful Shutdown; %d rows handed back unwritten when Shutdown's context ended (%s)",
		len(first), len(second), fmt.Sprint(d2.Stats()))
}
