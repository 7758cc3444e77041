package outbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/wire"
)

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testMigrateIsIdempotentAndConcurrent)
}

func testMigrateIsIdempotentAndConcurrent(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- migrateOutbox(ctx, db, "svc_") }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, migrateOutbox(ctx, db, "svc_"))
	var versions []int
	require.NoError(t, db.Select(&versions, "SELECT version FROM svc_schema_migrations WHERE part = 'outbox'"))
	require.Equal(t, []int{1}, versions)
	var n int
	require.NoError(t, db.Get(&n, "SELECT COUNT(*) FROM svc_outbox"))
	require.Zero(t, n)
	require.ErrorIs(t, migrateOutbox(ctx, db, "bad;prefix"), ErrConfig)
}

func TestEnqueueJoinsTheCallersTransaction(t *testing.T) {
	t.Parallel()
	eachDB(t, testEnqueueJoinsTheCallersTransaction)
}

func testEnqueueJoinsTheCallersTransaction(t *testing.T, b *bed) {
	ctx := context.Background()
	ev := Event{EventType: "OrderCreated", EventVersion: 1, AggregateType: "Order", AggregateID: "o-1",
		AggregateVersion: 1, Destination: "orders", MessageKey: "o-1", Payload: []byte(`{"id":"o-1"}`),
		Headers: map[string]string{"trace": "t-1"}}

	// rolled back: no row
	tx, err := b.db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	rolledBack, err := b.table.Enqueue(ctx, tx, ev)
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	_, err = b.table.Get(ctx, b.db, rolledBack)
	require.ErrorIs(t, err, ErrNotFound)

	// committed: a PENDING row with every field
	tx, err = b.db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	id, err := b.table.Enqueue(ctx, tx, ev)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	require.Len(t, id, 36, "default id is a UUID")
	row, err := b.table.Get(ctx, b.db, id)
	require.NoError(t, err)
	want := ev
	want.EventID = id
	require.Equal(t, want, row.Event)
	require.Equal(t, StatusPending, row.Status)
	require.Zero(t, row.RetryCount)
	require.False(t, row.CreatedAt.IsZero())
	require.True(t, row.SentAt.IsZero())
	require.WithinDuration(t, time.Now().UTC(), row.CreatedAt, time.Minute, "created_at is UTC")

	// same id again: typed duplicate error
	ev.EventID = id
	_, err = b.table.Enqueue(ctx, b.db, ev)
	require.ErrorIs(t, err, ErrDuplicateEvent)
	// invalid: nothing written
	_, err = b.table.Enqueue(ctx, b.db, Event{EventType: "X"})
	require.ErrorIs(t, err, ErrInvalidEvent)
	require.Equal(t, map[Status]int{StatusPending: 1}, b.counts(t))

	// A duplicate leaves the caller's transaction usable on both databases
	// (PostgreSQL aborts a transaction on any failed statement): the other
	// work in it commits.
	tx, err = b.db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	_, err = b.table.Enqueue(ctx, tx, ev)
	require.ErrorIs(t, err, ErrDuplicateEvent)
	after, err := b.table.Enqueue(ctx, tx, Event{EventType: "OrderShipped", Destination: "orders"})
	require.NoError(t, err, "the transaction goes on after a duplicate")
	require.NoError(t, tx.Commit())
	row, err = b.table.Get(ctx, b.db, after)
	require.NoError(t, err)
	require.Equal(t, StatusPending, row.Status)
	require.Equal(t, map[Status]int{StatusPending: 2}, b.counts(t))

	// A plain *sql.Tx names no driver: refused unless the table is bound to
	// one, and nothing is written (no SQL for a guessed database is sent).
	stx, err := b.db.DB.BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = b.table.Enqueue(ctx, stx, Event{EventType: "OrderCreated", Destination: "orders"})
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "WithDriver")
	bound, err := b.table.WithDriver(b.db.DriverName())
	require.NoError(t, err)
	plain, err := bound.Enqueue(ctx, stx, Event{EventType: "OrderCreated", Destination: "orders"})
	require.NoError(t, err)
	require.NoError(t, stx.Commit())
	row, err = b.table.Get(ctx, b.db, plain)
	require.NoError(t, err)
	require.Equal(t, StatusPending, row.Status)
	require.Equal(t, map[Status]int{StatusPending: 3}, b.counts(t))
}

// TestLeaseTakeoverAndStaleOwner drives the claim SQL directly: a row whose
// lease expired is taken over with a new token, and the old owner's outcome
// updates nothing.
func TestLeaseTakeoverAndStaleOwner(t *testing.T) {
	t.Parallel()
	eachDB(t, testLeaseTakeoverAndStaleOwner)
}

func testLeaseTakeoverAndStaleOwner(t *testing.T, b *bed) {
	ctx := context.Background()
	ids := b.enqueue(t, events("t", 3)...)
	q := newQueries(dialect.Must(b.db), b.table.Name())
	q.stmts = stmtcache.New(b.db)
	defer q.stmts.Close()

	first, err := q.claim(ctx, b.db, "A.1", 10, time.Millisecond)
	require.NoError(t, err)
	require.Len(t, first, 3)
	for _, r := range first {
		require.False(t, r.tookOver)
	}
	var second []claimedRow
	testenv.Eventually(t, 10*time.Second, "the 1ms leases to expire", func() bool {
		second, err = q.claim(ctx, b.db, "B.1", 10, time.Minute)
		require.NoError(t, err)
		return len(second) == 3
	})
	for _, r := range second {
		require.True(t, r.tookOver)
		require.Equal(t, "A.1", r.OwnerToken.String, "previous owner is visible to the taker")
	}
	// A is stale: none of its outcomes land.
	n, err := q.markSent(ctx, ids[0], "A.1")
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = q.markDead(ctx, ids[1], "A.1", "x", "y")
	require.NoError(t, err)
	require.Zero(t, n)
	// B owns them, with a live lease: nobody else can claim.
	third, err := q.claim(ctx, b.db, "C.1", 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, third)
	n, err = q.markSent(ctx, ids[0], "B.1")
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	n, err = q.markSent(ctx, ids[0], "B.1")
	require.NoError(t, err)
	require.Zero(t, n, "marking twice changes nothing")
	row, err := b.table.Get(ctx, b.db, ids[0])
	require.NoError(t, err)
	require.Equal(t, StatusSent, row.Status)
	require.Equal(t, "B.1", row.OwnerToken)
	require.False(t, row.SentAt.IsZero())
	t.Logf("takeover: 3 rows claimed by A with a 1ms lease, taken over by B; A's 2 late outcomes updated 0 rows")
}

// TestTwoDispatchersRace: 2000 rows, two dispatchers with their own
// producers. Every row is SENT, the consumer sees 2000 distinct ids, and
// with no faults nothing is sent twice.
func TestTwoDispatchersRace(t *testing.T) {
	t.Parallel()
	for _, k := range sinkKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			eachDB(t, func(t *testing.T, b *bed) { runRace(t, b, k.held) })
		})
	}
}

func runRace(t *testing.T, b *bed, held bool) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 8)
	col := testenv.Collect(t, topic)
	const n = 2000
	ids := b.enqueue(t, events(topic, n)...)

	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	var sinks []*countingSink
	var use []Sink
	for i := 0; i < 2; i++ {
		u, c := countingKind(b.sink(t), held)
		use, sinks = append(use, u), append(sinks, c)
	}
	var ds []*Dispatcher
	var mu sync.Mutex
	failures := map[string]int{} // error code -> count, to explain any retry
	onOutcome := func(o Outcome) {
		if o.Err != nil {
			mu.Lock()
			failures[CodeOf(o.Err)]++
			mu.Unlock()
		}
	}
	start := time.Now()
	for i, s := range use {
		ds = append(ds, b.dispatcher(t, Config{Sink: s, Name: fmt.Sprintf("race-%d", i), BatchSize: 32,
			Concurrency: 16, PollInterval: 200 * time.Millisecond, Observe: observe.Observe{Metrics: m}, MetricsInterval: 100 * time.Millisecond,
			OnOutcome: onOutcome}))
	}
	b.waitStatus(t, StatusSent, n, 3*time.Minute)
	elapsed := time.Since(start)
	snap := col.WaitDistinct(t, n, time.Minute)

	sends, dupSends := 0, 0
	perDispatcher := make([]int, len(sinks))
	seen := map[string]int{}
	for i, s := range sinks {
		perID, _ := s.snapshot()
		for id, c := range perID {
			sends += c
			perDispatcher[i] += c
			seen[id] += c
		}
	}
	for _, c := range seen {
		dupSends += c - 1
	}
	for _, id := range ids {
		require.Contains(t, snap.Counts, id)
	}
	var claimed, tookOver, retried, unknown int64
	for _, d := range ds {
		st := d.Stats()
		claimed += st.Claimed
		tookOver += st.TookOver
		retried += st.Retried
		unknown += st.Unknown
		require.Zero(t, st.LostLeases)
	}
	t.Logf("race (held %v): %d rows, dispatcher sends %v, total sends %d, duplicate sends %d, consumer deliveries %d distinct %d, claims %d (retries %d, unknown results %d, takeovers %d), failures %v, %.1fs",
		held, n, perDispatcher, sends, dupSends, snap.Total, snap.Distinct(), claimed, retried, unknown, tookOver, failuresText(&mu, failures), elapsed.Seconds())
	require.Equal(t, n, len(seen))
	require.Zero(t, tookOver)
	// Each row is claimed once, plus once per recorded failure: two
	// dispatchers never hold one row at the same time.
	require.Equal(t, int64(n)+retried+unknown, claimed)
	// Without faults nothing is sent twice; a duplicate needs an unknown
	// result (a timeout after the broker stored the message).
	require.LessOrEqual(t, int64(dupSends), unknown, "duplicate sends without an unknown result")
	require.Positive(t, perDispatcher[0])
	require.Positive(t, perDispatcher[1])
	require.Equal(t, float64(sends), testutil.ToFloat64(m.OutboxSends.WithLabelValues(topic, "ThingHappened", "success", "")))
	require.Equal(t, uint64(0), uint64(testutil.ToFloat64(m.OutboxLeaseExpired.WithLabelValues(topic))))
	// the backlog gauge drains to zero (the row disappears from the vector)
	testenv.Eventually(t, 10*time.Second, "pending gauge to drain", func() bool {
		return testutil.CollectAndCount(m.OutboxPending) == 0
	})
}

func failuresText(mu *sync.Mutex, m map[string]int) string {
	mu.Lock()
	defer mu.Unlock()
	return fmt.Sprint(m)
}

// TestBrokerUnreachableThenBack: the sink's name server is down (nothing
// listens on its address), so every send fails and rows go to RETRY with
// growing backoff ceilings. Then the name server comes back on that address
// (a forwarder to the real one) and everything is sent, by the same
// dispatcher and sink. The shared broker itself is never stopped.
func TestBrokerUnreachableThenBack(t *testing.T) {
	t.Parallel()
	eachDB(t, testBrokerUnreachableThenBack)
}

func testBrokerUnreachableThenBack(t *testing.T, b *bed) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	port := freePort(t)
	sink := b.sink(t, fmt.Sprintf("127.0.0.1:%d", port))
	const n = 20
	ids := b.enqueue(t, events(topic, n)...)
	// Start refuses a sink whose name server does not answer; the outage
	// this test is about begins after a successful Start.
	requireStartRefused(t, b, sink, fmt.Sprintf("127.0.0.1:%d", port))

	var mu sync.Mutex
	delays := map[int][]time.Duration{} // retry index -> chosen delays
	codes := map[string]int{}
	base, max := 40*time.Millisecond, 2*time.Second
	d := b.dispatcher(t, Config{Sink: outageAfterStart{sink}, BatchSize: 10, Concurrency: 10, PollInterval: 50 * time.Millisecond,
		BackoffBase: base, BackoffMax: max, MaxRetries: 100,
		OnOutcome: func(o Outcome) {
			if o.Status != StatusRetry {
				return
			}
			mu.Lock()
			delays[o.Attempt-1] = append(delays[o.Attempt-1], o.RetryIn)
			codes[CodeOf(o.Err)]++
			mu.Unlock()
		}})
	const retries = 5
	testenv.Eventually(t, 2*time.Minute, "every row to fail 5 times", func() bool {
		var min int
		require.NoError(t, b.db.Get(&min, "SELECT MIN(retry_count) FROM "+b.table.Name()))
		return min >= retries
	})
	require.Zero(t, b.counts(t)[StatusSent])
	require.Zero(t, col.Snapshot().Total)

	mu.Lock()
	var means []time.Duration
	for i := 0; i < retries; i++ {
		var sum time.Duration
		for _, x := range delays[i] {
			require.LessOrEqual(t, x, BackoffCeiling(i, base, max))
			sum += x
		}
		require.GreaterOrEqual(t, len(delays[i]), n)
		means = append(means, sum/time.Duration(len(delays[i])))
	}
	gotCodes := fmt.Sprint(codes)
	mu.Unlock()
	require.Contains(t, gotCodes, "no_route")
	// ceilings double; with 20 rows the mean delay of retry 4 (ceiling
	// 640ms) is far above that of retry 0 (ceiling 40ms)
	require.Greater(t, means[4], means[0])
	require.Greater(t, means[4], means[1])

	forward(t, port, b.s.NameServer) // the name server is back
	d.Notify()
	b.waitStatus(t, StatusSent, n, 2*time.Minute)
	snap := col.WaitDistinct(t, n, time.Minute)
	for _, id := range ids {
		require.Contains(t, snap.Counts, id)
	}
	var maxRetry int
	require.NoError(t, b.db.Get(&maxRetry, "SELECT MAX(retry_count) FROM "+b.table.Name()))
	st := d.Stats()
	t.Logf("broker unreachable: %d rows, mean backoff per retry %v (ceilings %v..%v), error codes %s, retries %d, then all %d SENT, consumer distinct %d deliveries %d, max retry_count %d",
		n, means, BackoffCeiling(0, base, max), BackoffCeiling(retries-1, base, max), gotCodes, st.Retried+st.Unknown, st.Sent, snap.Distinct(), snap.Total, maxRetry)
}

// TestPermanentErrorsGoDeadAtOnce uses refusals from the real broker (the
// shared broker auto-creates topics, so "topic missing" cannot be produced
// there; see the sink's doc for why "no route" is retried):
//   - properties above the broker's 32 KiB limit: MESSAGE_ILLEGAL (13)
//   - a system topic the broker forbids sending to: NO_PERMISSION (16)
//   - an invalid topic name, refused by the sink before sending.
//
// Each row is DEAD after exactly one attempt with retry_count 0, and a later
// good row is sent while the dead ones are never attempted again.
func TestPermanentErrorsGoDeadAtOnce(t *testing.T) {
	t.Parallel()
	eachDB(t, testPermanentErrorsGoDeadAtOnce)
}

func testPermanentErrorsGoDeadAtOnce(t *testing.T, b *bed) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	// 10 headers of 4000 bytes: each within the envelope's limits, together
	// above the broker's 32 KiB limit on message properties.
	big := map[string]string{}
	for i := 0; i < 10; i++ {
		big[fmt.Sprintf("h%d", i)] = strings.Repeat("x", 4000)
	}
	bad := []Event{
		{EventType: "BigHeaders", Destination: topic, Payload: []byte("x"), Headers: big},
		{EventType: "Forbidden", Destination: "SELF_TEST_TOPIC", Payload: []byte("x")},
		{EventType: "BadName", Destination: "no spaces allowed", Payload: []byte("x")},
	}
	badIDs := b.enqueue(t, bad...)
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	sink := counting(b.sink(t))
	d := b.dispatcher(t, Config{Sink: sink, PollInterval: 20 * time.Millisecond, BackoffBase: time.Millisecond,
		BackoffMax: 10 * time.Millisecond, MaxRetries: 50, Observe: observe.Observe{Metrics: m}})
	b.waitStatus(t, StatusDead, len(bad), time.Minute)

	good := b.enqueue(t, events(topic, 1)...)
	d.Notify()
	b.waitStatus(t, StatusSent, 1, time.Minute)
	col.WaitDistinct(t, 1, time.Minute)
	_, attempts := sink.snapshot()
	for _, id := range badIDs {
		row, err := b.table.Get(context.Background(), b.db, id)
		require.NoError(t, err)
		require.Equal(t, StatusDead, row.Status)
		require.Zero(t, row.RetryCount, id)
		t.Logf("permanent: %-9s -> DEAD, retry_count %d, code %s, error %q", row.EventType, row.RetryCount, row.LastErrorCode, row.LastErrorMessage)
	}
	rows := map[string]Row{}
	for _, id := range badIDs {
		r, _ := b.table.Get(context.Background(), b.db, id)
		rows[r.EventType] = r
	}
	require.Equal(t, "message_illegal", rows["BigHeaders"].LastErrorCode)
	require.Equal(t, "no_permission", rows["Forbidden"].LastErrorCode)
	require.Equal(t, "invalid_destination", rows["BadName"].LastErrorCode)
	require.Equal(t, len(bad)+len(good), attempts, "one attempt per row: no hot loop")
	deadCount := testutil.ToFloat64(m.OutboxSends.WithLabelValues(topic, "BigHeaders", "dead", "permanent")) +
		testutil.ToFloat64(m.OutboxSends.WithLabelValues("SELF_TEST_TOPIC", "Forbidden", "dead", "permanent")) +
		testutil.ToFloat64(m.OutboxSends.WithLabelValues("no spaces allowed", "BadName", "dead", "permanent"))
	require.Equal(t, float64(len(bad)), deadCount, "the dead metric to alert on")
	st := d.Stats()
	require.EqualValues(t, len(bad), st.Dead)
	require.Zero(t, st.Retried+st.Unknown)
	t.Logf("permanent: %d rows DEAD after %d send attempts in total (1 each), then 1 good row SENT; dead metric %v",
		len(bad), attempts-len(good), deadCount)
}

// TestRetriesExhaustedGoDead: a sink that always fails transiently makes a
// row DEAD after MaxRetries retries.
func TestRetriesExhaustedGoDead(t *testing.T) {
	t.Parallel()
	eachDB(t, testRetriesExhaustedGoDead)
}

func testRetriesExhaustedGoDead(t *testing.T, b *bed) {
	var calls sync.Map
	sink := FuncSink(func(_ context.Context, m *Message) error {
		v, _ := calls.LoadOrStore(m.EventID, new(int))
		*(v.(*int))++
		return Transient(errors.New("downstream busy"))
	})
	ids := b.enqueue(t, events("cmd", 2)...)
	b.dispatcher(t, Config{Sink: sink, PollInterval: 20 * time.Millisecond, BackoffBase: time.Millisecond,
		BackoffMax: 5 * time.Millisecond, MaxRetries: 3})
	b.waitStatus(t, StatusDead, 2, time.Minute)
	for _, id := range ids {
		row, err := b.table.Get(context.Background(), b.db, id)
		require.NoError(t, err)
		require.Equal(t, 3, row.RetryCount)
		require.Equal(t, "transient", row.LastErrorCode)
		require.Equal(t, "downstream busy", row.LastErrorMessage)
		v, _ := calls.Load(id)
		require.Equal(t, 4, *(v.(*int)), "1 attempt + 3 retries")
	}
}

// TestCommandOutboxHTTP: the command outbox calls an HTTP endpoint with the
// event id as Idempotency-Key. Some first calls fail with 503, some have
// their response lost after the server acted; both are resent with the same
// key, and every key arrives.
func TestCommandOutboxHTTP(t *testing.T) {
	t.Parallel()
	eachDB(t, testCommandOutboxHTTP)
}

func testCommandOutboxHTTP(t *testing.T, b *bed) {
	var mu sync.Mutex
	calls := map[string][]string{} // key -> attempt header of each call
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		calls[key] = append(calls[key], r.Header.Get("X-Attempt"))
		first := len(calls[key]) == 1
		mu.Unlock()
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		switch {
		case first && h.Sum32()%4 == 0:
			w.WriteHeader(http.StatusServiceUnavailable)
		case first && h.Sum32()%4 == 1:
			// acted, then the response is lost
			hj, ok := w.(http.Hijacker)
			if !ok {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			c, _, _ := hj.Hijack()
			_ = c.Close()
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	t.Cleanup(srv.Close)
	client := srv.Client()
	sink := FuncSink(func(ctx context.Context, m *Message) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/sms", nil)
		if err != nil {
			return Permanent(err)
		}
		req.Header.Set("Idempotency-Key", m.IdempotencyKey())
		req.Header.Set("X-Attempt", strconv.Itoa(m.Attempt))
		resp, err := client.Do(req)
		if err != nil {
			return Unknown(err) // the request may have been acted on
		}
		_ = resp.Body.Close()
		return FromHTTPStatus(resp.StatusCode)
	})
	const n = 100
	evs := make([]Event, n)
	for i := range evs {
		evs[i] = Event{EventType: "SendSMS", Destination: "sms-gateway", MessageKey: fmt.Sprintf("user-%d", i),
			Payload: []byte(`{"to":"redacted"}`)}
	}
	ids := b.enqueue(t, evs...)
	b.dispatcher(t, Config{Sink: sink, PollInterval: 50 * time.Millisecond, BackoffBase: 5 * time.Millisecond,
		BackoffMax: 50 * time.Millisecond})
	b.waitStatus(t, StatusSent, n, time.Minute)

	mu.Lock()
	defer mu.Unlock()
	total, failed503, lost, outboxResends := 0, 0, 0, 0
	for _, id := range ids {
		got := calls[id]
		require.NotEmpty(t, got, "key %s never arrived", id)
		total += len(got)
		if got[len(got)-1] != "1" {
			outboxResends++
		}
		h := fnv.New32a()
		_, _ = h.Write([]byte(id))
		switch h.Sum32() % 4 {
		case 0:
			failed503++
			require.Equal(t, []string{"1", "2"}, got, "after a 503 the outbox resends the same key as attempt 2")
		case 1:
			lost++
			// net/http itself replays a request carrying Idempotency-Key
			// when the connection drops; otherwise the outbox resends.
			require.GreaterOrEqual(t, len(got), 2, "a lost response is resent with the same key")
		default:
			require.Equal(t, []string{"1"}, got)
		}
	}
	require.Len(t, calls, n, "only our keys arrived")
	require.Positive(t, failed503)
	require.Positive(t, lost)
	t.Logf("command outbox: %d keys arrived (0 missing), %d calls; %d keys got a 503 first and %d a lost response, all resent with the same key (%d resends by the outbox, the rest replayed by net/http)",
		len(calls), total, failed503, lost, outboxResends)
}

// TestPerAggregateOrder: 50 aggregates x 20 versions, enqueued version by
// version in separate transactions, sent by two dispatchers. Every aggregate
// lands on one queue, and in that queue its versions are stored in version
// order: the order any orderly consumer of the queue consumes them in.
//
// The raw consumer used here is the concurrent testenv collector, reading each
// message's queue id and queue offset: rocketmq-client-go's orderly push
// consumer trips the race detector (processQueue.takeMessages reads msgCache
// without its mutex), and the project's tests run with -race.
func TestPerAggregateOrder(t *testing.T) {
	t.Parallel()
	for _, k := range sinkKinds {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			eachDB(t, func(t *testing.T, b *bed) { runOrder(t, b, k.held) })
		})
	}
}

// jitterBatch delays each batch send a little, so sends overtake each
// other; it is a BatchSink, so its dispatcher holds its claims. Its first
// send waits at the gate.
type jitterBatch struct {
	countingBatch
	gate *bothGate
	i    int
}

func (j jitterBatch) SendBatch(ctx context.Context, msgs []*Message) []error {
	j.gate.pass(j.i)
	time.Sleep(time.Duration(mrand.IntN(3000)) * time.Microsecond)
	return j.countingBatch.SendBatch(ctx, msgs)
}

// bothGate holds the sends of each of two dispatchers until both have a
// send to make (bounded by a minute), so that both provably take part: a
// dispatcher holds far fewer rows than the test enqueues, so while its
// sends wait, the other claims the rest. Without it the first dispatcher
// to start could send every row before the second claimed one.
type bothGate struct {
	mu   sync.Mutex
	seen [2]bool
	open chan struct{}
}

func newBothGate() *bothGate { return &bothGate{open: make(chan struct{})} }

func (g *bothGate) pass(i int) {
	g.mu.Lock()
	if !g.seen[i] {
		g.seen[i] = true
		if g.seen[0] && g.seen[1] {
			close(g.open)
		}
	}
	g.mu.Unlock()
	select {
	case <-g.open:
	case <-time.After(time.Minute):
	}
}

func runOrder(t *testing.T, b *bed, held bool) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 8)
	col := testenv.Collect(t, topic)
	const aggs, versions = 50, 20
	// Each aggregate's 20 versions in one transaction, inserted in shuffled
	// order, so a claim sees many versions of one aggregate at once.
	for a := 0; a < aggs; a++ {
		var evs []Event
		for _, v := range mrand.Perm(versions) {
			evs = append(evs, Event{EventType: "AccountChanged", AggregateType: "Account", AggregateID: fmt.Sprintf("acc-%02d", a),
				AggregateVersion: int64(v + 1), Destination: topic, Payload: fmt.Appendf(nil, `{"v":%d}`, v+1)})
		}
		b.enqueue(t, evs...)
	}
	var sinks []*countingSink
	gate := newBothGate()
	for i := 0; i < 2; i++ {
		// a small random delay per send makes sends overtake each other
		var jittered Sink
		if held {
			c := countingB(b.sink(t))
			sinks, jittered = append(sinks, c.countingSink), jitterBatch{countingBatch: c, gate: gate, i: i}
		} else {
			s := counting(b.sink(t))
			sinks = append(sinks, s)
			jittered = FuncSink(func(ctx context.Context, m *Message) error {
				gate.pass(i)
				time.Sleep(time.Duration(mrand.IntN(3000)) * time.Microsecond)
				return s.Send(ctx, m)
			})
		}
		// 4 sends in flight hold at most 4 batches of 32 and their claims
		// ahead: well under the 1,000 rows, so the other dispatcher finds
		// rows to claim while this one's sends wait at the gate.
		b.dispatcher(t, Config{Sink: jittered, Name: fmt.Sprintf("order-%d", i), BatchSize: 32, Concurrency: 4,
			PollInterval: 100 * time.Millisecond})
	}
	b.waitStatus(t, StatusSent, aggs*versions, 3*time.Minute)
	snap := col.WaitDistinct(t, aggs*versions, 2*time.Minute)

	type stored struct {
		queue   int
		offset  int64
		version int64
	}
	perAgg := map[string][]stored{}
	for id := range snap.Counts {
		m := col.Message(id)
		e, err := wire.Decode(m.GetProperties())
		require.NoError(t, err)
		k := e.AggregateType + "/" + e.AggregateID
		perAgg[k] = append(perAgg[k], stored{queue: m.Queue.QueueId, offset: m.QueueOffset, version: e.AggregateVersion})
	}
	require.Len(t, perAgg, aggs)
	want := make([]int64, versions)
	for i := range want {
		want[i] = int64(i + 1)
	}
	queuesUsed := map[int]int{}
	for k, ms := range perAgg {
		sort.Slice(ms, func(i, j int) bool { return ms[i].offset < ms[j].offset })
		got := make([]int64, 0, len(ms))
		for _, m := range ms {
			require.Equal(t, ms[0].queue, m.queue, "aggregate %s spread over queues", k)
			got = append(got, m.version)
		}
		require.Equal(t, want, got, "aggregate %s stored out of order", k)
		queuesUsed[ms[0].queue]++
	}
	per := []int{}
	for _, s := range sinks {
		perID, _ := s.snapshot()
		c := 0
		for _, x := range perID {
			c += x
		}
		per = append(per, c)
	}
	t.Logf("order (held %v): %d aggregates x %d versions, %d distinct delivered (%d deliveries); every aggregate on one queue in version order; aggregates per queue %v; sends per dispatcher %v",
		held, aggs, versions, snap.Distinct(), snap.Total, queuesUsed, per)
	require.Positive(t, per[0], "dispatcher 0 sent")
	require.Positive(t, per[1], "dispatcher 1 sent")
}

// TestShutdownDrainsAndHandsBack: Shutdown waits for a send in flight; when
// its context ends first, the send is cancelled and the row handed back
// without consuming a retry. No goroutine outlives Shutdown. (Not parallel:
// it counts the package's goroutines.)
func TestShutdownDrainsAndHandsBack(t *testing.T) {
	eachDBSerial(t, testShutdownDrainsAndHandsBack)
}

func testShutdownDrainsAndHandsBack(t *testing.T, b *bed) {
	requireNoDispatcherGoroutines(t, "no dispatcher runs before the test")
	entered := make(chan string, 10)
	release := make(chan struct{})
	sink := FuncSink(func(ctx context.Context, m *Message) error {
		entered <- m.EventID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return Unknown(ctx.Err())
		}
	})
	ids := b.enqueue(t, events("cmd", 1)...)
	cfg := Config{DB: b.db, Sink: sink, Concurrency: 1, PollInterval: 20 * time.Millisecond}

	// 1: a graceful Shutdown waits for the send and records SENT.
	d1, err := NewDispatcher(cfg)
	require.NoError(t, err)
	require.NoError(t, d1.Start(context.Background()))
	first := <-entered
	done := make(chan error, 1)
	go func() { done <- d1.Shutdown(context.Background()) }()
	close(release)
	require.NoError(t, <-done)
	row, err := b.table.Get(context.Background(), b.db, first)
	require.NoError(t, err)
	require.Equal(t, StatusSent, row.Status)
	require.NoError(t, d1.Shutdown(context.Background()), "idempotent")
	require.ErrorIs(t, d1.Start(context.Background()), ErrClosed)

	// 2: a Shutdown whose context ends cancels the send; the row is PENDING
	// again, due at once, retry_count unchanged.
	release = make(chan struct{})
	ids = append(ids, b.enqueue(t, events("cmd", 1)...)...)
	d2, err := NewDispatcher(cfg)
	require.NoError(t, err)
	require.NoError(t, d2.Start(context.Background()))
	second := <-entered
	require.NotEqual(t, first, second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, d2.Shutdown(ctx), context.Canceled)
	row, err = b.table.Get(context.Background(), b.db, second)
	require.NoError(t, err)
	require.Equal(t, StatusPending, row.Status)
	require.Zero(t, row.RetryCount)
	require.EqualValues(t, 1, d2.Stats().Released)
	require.NoError(t, d2.Close())
	require.ElementsMatch(t, ids, []string{first, second})
	requireNoDispatcherGoroutines(t, "Shutdown leaves no dispatcher goroutine behind")
}

// requireNoDispatcherGoroutines waits until no goroutine runs a Dispatcher
// method. A goroutine that has signalled its end (closed a channel that
// Shutdown waits for) is still on the stack until it returns, which on a
// loaded machine can take a moment, so the count is polled; a real leak
// stays and fails after the bound.
func requireNoDispatcherGoroutines(t *testing.T, msg string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for left := dispatcherStacks(); len(left) != 0; left = dispatcherStacks() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d dispatcher goroutines still run after 10s:\n%s", msg, len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// dispatcherStacks returns the stacks of goroutines running a Dispatcher
// method.
func dispatcherStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "rmqtx/outbox.(*Dispatcher)") {
			out = append(out, g)
		}
	}
	return out
}
