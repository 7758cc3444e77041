package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

func queueList(topic string, n int) []*primitive.MessageQueue {
	qs := make([]*primitive.MessageQueue, n)
	for i := range qs {
		qs[i] = &primitive.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueId: i}
	}
	return qs
}

func aggMsg(topic, agg string, v int64, payload []byte) *Message {
	return &Message{Event: Event{EventID: fmt.Sprintf("%s-%s-%d", topic, agg, v), EventType: "Changed", Destination: topic,
		AggregateType: "Acc", AggregateID: agg, AggregateVersion: v, Payload: payload}, Attempt: 1}
}

// Batches: one group per topic and target queue, in claim order; a keyed
// message maps to the queue Send would pick for it alone; messages without a
// key share one group; large, invalid and not-yet-routed messages go alone;
// a group stays under MaxBatchBytes.
func TestBatchesGroupByQueue(t *testing.T) {
	t.Parallel()
	s := &RocketMQSink{queues: newQueueBook(), maxBatchBytes: 64 << 10}
	s.queues.record("t", queueList("t", 4))
	var msgs []*Message
	for i := 0; i < 12; i++ {
		msgs = append(msgs, aggMsg("t", fmt.Sprintf("a%d", i), 1, []byte(`{}`)))
	}
	keyless := []*Message{
		{Event: Event{EventID: "free-1", EventType: "X", Destination: "t", Payload: []byte("1")}, Attempt: 1},
		{Event: Event{EventID: "free-2", EventType: "X", Destination: "t", Payload: []byte("2")}, Attempt: 1},
	}
	big := aggMsg("t", "big", 1, bytes.Repeat([]byte("x"), 40<<10))            // above half of 64 KiB
	bad := aggMsg("not.a.topic", "bad", 1, []byte(`{}`))                       // the sink refuses it
	unrouted := aggMsg("other", "u", 1, []byte(`{}`))                          // no queue list yet
	mid := []*Message{aggMsg("t", "m1", 1, bytes.Repeat([]byte("y"), 20<<10)), // three of these exceed 64 KiB together
		aggMsg("t", "m1", 2, bytes.Repeat([]byte("y"), 20<<10)), aggMsg("t", "m1", 3, bytes.Repeat([]byte("y"), 20<<10))}
	msgs = append(append(append(msgs, keyless...), big, bad, unrouted), mid...)

	groups := s.Batches(msgs)
	seen := map[*Message]int{}
	alone := map[*Message]bool{}
	for _, g := range groups {
		require.NotEmpty(t, g)
		size := 0
		for _, m := range g {
			seen[m]++
			size += len(m.Payload) + batchOverhead
		}
		if len(g) == 1 {
			alone[g[0]] = true
			continue
		}
		require.LessOrEqual(t, size, s.maxBatchBytes, "a group above MaxBatchBytes")
		topic := g[0].Destination
		q := -1
		if k := ShardingKey(g[0].Event); k != "" {
			q = queueIndex(k, 4)
		}
		for _, m := range g {
			require.Equal(t, topic, m.Destination)
			if k := ShardingKey(m.Event); k != "" {
				require.Equal(t, q, queueIndex(k, 4), "one group, one queue")
			} else {
				require.Equal(t, -1, q, "keyless and keyed messages mixed")
			}
		}
	}
	require.Len(t, seen, len(msgs), "every message in a group")
	for m, n := range seen {
		require.Equal(t, 1, n, "%s in %d groups", m.EventID, n)
	}
	for _, m := range []*Message{big, bad, unrouted} {
		require.True(t, alone[m], "%s must go alone", m.EventID)
	}
	// Claim order within a group: m1's versions stay in order (two groups of
	// at most two, or alone).
	var order []int64
	for _, g := range groups {
		for _, m := range g {
			if m.AggregateID == "m1" {
				order = append(order, m.AggregateVersion)
			}
		}
	}
	require.Equal(t, []int64{1, 2, 3}, order)
	// 12 aggregates on 4 queues: fewer groups than messages.
	require.Less(t, len(groups), len(msgs)-5)

	// Batching off: every message alone.
	off := &RocketMQSink{queues: s.queues, maxBatchBytes: -1}
	require.Len(t, off.Batches(msgs), len(msgs))
}

// batchRecorder wraps a BatchSink: it records each SendBatch group and can
// make a group fail before it is sent (transient) or after it was sent (an
// unknown result, as a lost reply would be).
type batchRecorder struct {
	BatchSink
	mu       sync.Mutex
	groups   [][]string
	failWhen func(ids []string, call int) (err error, afterSend bool)
	calls    int
}

func (r *batchRecorder) SendBatch(ctx context.Context, msgs []*Message) []error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.EventID
	}
	r.mu.Lock()
	r.groups = append(r.groups, ids)
	r.calls++
	call := r.calls
	r.mu.Unlock()
	var fail error
	after := false
	if r.failWhen != nil {
		fail, after = r.failWhen(ids, call)
	}
	if fail != nil && !after {
		return repeat(fail, len(msgs))
	}
	errs := r.BatchSink.SendBatch(ctx, msgs)
	if fail != nil {
		return repeat(fail, len(msgs))
	}
	return errs
}

func repeat(err error, n int) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

func (r *batchRecorder) sizes() (batched, largest int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.groups {
		if len(g) > 1 {
			batched++
		}
		largest = max(largest, len(g))
	}
	return batched, largest
}

// Batch sends on the real broker: every event of an aggregate lands on one
// queue in version order, each event is delivered exactly once, rows really
// went in batches, a row too large for a batch went alone, and a row the
// sink refuses is DEAD alone while its claim's other rows are SENT.
func TestBatchSendsKeepOrderOnBroker(t *testing.T) {
	t.Parallel()
	eachDB(t, testBatchSendsKeepOrderOnBroker)
}

func testBatchSendsKeepOrderOnBroker(t *testing.T, b *bed) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	const aggs, versions, free = 12, 6, 30
	var evs []Event
	for v := 1; v <= versions; v++ {
		for a := 0; a < aggs; a++ {
			evs = append(evs, Event{EventType: "AccountChanged", AggregateType: "Account", AggregateID: fmt.Sprintf("acc-%02d", a),
				AggregateVersion: int64(v), Destination: topic, Payload: fmt.Appendf(nil, `{"v":%d}`, v)})
		}
	}
	for i := 0; i < free; i++ {
		evs = append(evs, Event{EventType: "Ping", Destination: topic, Payload: fmt.Appendf(nil, `{"i":%d}`, i)})
	}
	bigID := "big-" + testenv.RandSuffix(8)
	evs = append(evs, Event{EventID: bigID, EventType: "Ping", Destination: topic, Payload: bytes.Repeat([]byte("z"), 700<<10)})
	badID := "bad-" + testenv.RandSuffix(8)
	evs = append(evs, Event{EventID: badID, EventType: "Ping", Destination: "bad.topic", Payload: []byte("{}")})
	good := len(evs) - 1
	b.enqueue(t, evs...)

	rec := &batchRecorder{BatchSink: b.sink(t)}
	var mu sync.Mutex
	outcomes := map[string][]Status{}
	d := b.dispatcher(t, Config{Sink: rec, BatchSize: 64, Concurrency: 4, PollInterval: 100 * time.Millisecond,
		OnOutcome: func(o Outcome) {
			mu.Lock()
			outcomes[o.EventID] = append(outcomes[o.EventID], o.Status)
			mu.Unlock()
		}})
	b.waitStatus(t, StatusSent, good, 2*time.Minute)
	snap := col.WaitDistinct(t, good, time.Minute)
	// The DEAD mark and every outcome report may trail the last SENT row:
	// wait for them (bounded) before comparing.
	testenv.Eventually(t, time.Minute, "the bad row DEAD and every outcome reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(outcomes) == good+1 && len(outcomes[badID]) > 0 && b.counts(t)[StatusDead] == 1
	})
	require.Equal(t, map[Status]int{StatusSent: good, StatusDead: 1}, b.counts(t))
	for id, n := range snap.Counts {
		require.Equal(t, 1, n, "event %s delivered %d times", id, n)
	}
	require.Contains(t, snap.Counts, bigID)
	mu.Lock()
	require.Equal(t, []Status{StatusDead}, outcomes[badID])
	for id, st := range outcomes {
		if id != badID {
			require.Equal(t, []Status{StatusSent}, st, "event %s", id)
		}
	}
	mu.Unlock()

	perAgg := map[string][]struct {
		queue   int
		offset  int64
		version int64
	}{}
	for id := range snap.Counts {
		m := col.Message(id)
		e, err := wire.Decode(m.GetProperties())
		require.NoError(t, err)
		if e.AggregateID == "" {
			continue
		}
		perAgg[e.AggregateID] = append(perAgg[e.AggregateID], struct {
			queue   int
			offset  int64
			version int64
		}{m.Queue.QueueId, m.QueueOffset, e.AggregateVersion})
	}
	require.Len(t, perAgg, aggs)
	for agg, ms := range perAgg {
		sort.Slice(ms, func(i, j int) bool { return ms[i].offset < ms[j].offset })
		for i, m := range ms {
			require.Equal(t, ms[0].queue, m.queue, "aggregate %s spread over queues", agg)
			require.EqualValues(t, i+1, m.version, "aggregate %s stored out of order", agg)
		}
		require.Equal(t, queueIndex("Account/"+agg, 4), ms[0].queue, "aggregate %s not on its hash queue", agg)
	}
	batched, largest := rec.sizes()
	require.Positive(t, batched, "rows must have gone in batches")
	rec.mu.Lock()
	for _, g := range rec.groups {
		for _, id := range g {
			if id == bigID {
				require.Len(t, g, 1, "the large row goes alone")
			}
		}
	}
	groups := len(rec.groups)
	rec.mu.Unlock()
	st := d.Stats()
	t.Logf("batch sends: %d rows SENT in %d requests (%d batches, largest %d), 1 DEAD; every aggregate on its queue in order; delivered distinct %d, total %d",
		st.Sent, groups, batched, largest, snap.Distinct(), snap.Total)
}

// A claim whose batches fail differently: one batch fails before it is
// sent (transient), one after (unknown: the broker has it, the reply was
// lost), the others succeed. Each row's outcome is its own batch's, the
// failed rows are retried and SENT, and the copies on the broker are
// exactly: one per row, two for the rows of the batch that was sent twice.
func TestBatchPartialFailureOutcomesExact(t *testing.T) {
	t.Parallel()
	eachDB(t, testBatchPartialFailureOutcomesExact)
}

func testBatchPartialFailureOutcomesExact(t *testing.T, b *bed) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	const aggs = 24
	var evs []Event
	for a := 0; a < aggs; a++ {
		evs = append(evs, Event{EventType: "AccountChanged", AggregateType: "Account", AggregateID: fmt.Sprintf("acc-%02d", a),
			AggregateVersion: 1, Destination: topic, Payload: fmt.Appendf(nil, `{"a":%d}`, a)})
	}
	sink := b.sink(t)
	// The sink learns the topic's queues from a first send, so that the
	// claims below are grouped by queue.
	warm := "warm-" + testenv.RandSuffix(6)
	require.NoError(t, sink.Send(context.Background(), &Message{Event: Event{EventID: warm,
		EventType: "Warm", Destination: topic, Payload: []byte("{}")}, Attempt: 1}))
	ids := b.enqueue(t, evs...)
	var fmu sync.Mutex
	failedBefore, failedAfter := map[string]bool{}, map[string]bool{}
	rec := &batchRecorder{BatchSink: sink, failWhen: func(ids []string, call int) (error, bool) {
		fmu.Lock()
		defer fmu.Unlock()
		if len(ids) < 2 {
			return nil, false
		}
		mark := func(m map[string]bool) {
			for _, id := range ids {
				m[id] = true
			}
		}
		switch {
		case len(failedBefore) == 0:
			mark(failedBefore)
			return Transient(errors.New("injected: broker busy")), false
		case len(failedAfter) == 0 && !failedBefore[ids[0]]:
			mark(failedAfter)
			return Unknown(errors.New("injected: reply lost")), true
		}
		return nil, false
	}}
	var mu sync.Mutex
	outcomes := map[string][]Status{}
	b.dispatcher(t, Config{Sink: rec, BatchSize: 64, Concurrency: 4, PollInterval: 50 * time.Millisecond,
		BackoffBase: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond,
		OnOutcome: func(o Outcome) {
			mu.Lock()
			outcomes[o.EventID] = append(outcomes[o.EventID], o.Status)
			mu.Unlock()
		}})
	b.waitStatus(t, StatusSent, aggs, 2*time.Minute)
	// The table shows SENT before the dispatcher reports the outcome
	// (OnOutcome runs after the mark commits): wait for every row's final
	// report too, so that the histories compared below are complete.
	testenv.Eventually(t, time.Minute, "every row's SENT outcome reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, id := range ids {
			if o := outcomes[id]; len(o) == 0 || o[len(o)-1] != StatusSent {
				return false
			}
		}
		return true
	})
	fmu.Lock()
	nBefore, nAfter := len(failedBefore), len(failedAfter)
	fmu.Unlock()
	require.Positive(t, nBefore, "a batch failed before its send")
	require.Positive(t, nAfter, "a batch failed after its send")
	// every row once, the rows of the batch whose reply was lost twice
	col.WaitUntil(time.Minute, func(s testenv.Snapshot) bool { return s.Total >= aggs+1+nAfter })
	snap := col.Snapshot()
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		var retryCount int
		require.NoError(t, b.db.Get(&retryCount, b.db.Rebind("SELECT retry_count FROM "+b.table.Name()+" WHERE event_id = ?"), id))
		switch {
		case failedBefore[id]:
			require.Equal(t, []Status{StatusRetry, StatusSent}, outcomes[id], "row %s of the batch that failed before sending", id)
			require.Equal(t, 1, snap.Counts[id], "row %s: never sent by the failed attempt", id)
			require.Equal(t, 1, retryCount)
		case failedAfter[id]:
			require.Equal(t, []Status{StatusRetry, StatusSent}, outcomes[id], "row %s of the batch whose reply was lost", id)
			require.Equal(t, 2, snap.Counts[id], "row %s: sent by both attempts", id)
			require.Equal(t, 1, retryCount)
		default:
			require.Equal(t, []Status{StatusSent}, outcomes[id], "row %s of a batch that succeeded", id)
			require.Equal(t, 1, snap.Counts[id], "row %s", id)
			require.Zero(t, retryCount)
		}
	}
	require.Equal(t, aggs+1+nAfter, snap.Total, "no other copy")
	t.Logf("partial failure: %d rows; a batch of %d failed before sending, a batch of %d after; retried and SENT; delivered distinct %d, total %d",
		aggs, nBefore, nAfter, snap.Distinct(), snap.Total)
}

// A batch the broker refuses as a whole (above its 4 MiB message limit) may
// be one message's fault: every row is then sent alone, and each gets its
// own outcome (here all SENT, each delivered once).
func TestBatchRefusedByBrokerSendsRowsAlone(t *testing.T) {
	t.Parallel()
	eachDBSerial(t, testBatchRefusedByBrokerSendsRowsAlone)
}

func testBatchRefusedByBrokerSendsRowsAlone(t *testing.T, b *bed) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	sink, err := NewRocketMQSink(RocketMQConfig{NameServers: []string{b.s.NameServer}, Group: testenv.Name(t, "pg"),
		InstanceName: testenv.Name(t, "inst"), MaxBatchBytes: 32 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	const n, size = 6, 1600 << 10 // any 3 of them in one batch: above the broker's 4 MiB
	var evs []Event
	for i := 0; i < n; i++ {
		evs = append(evs, Event{EventType: "Blob", Destination: topic, Payload: bytes.Repeat([]byte{'a' + byte(i)}, size)})
	}
	ids := b.enqueue(t, evs...)
	rec := &batchRecorder{BatchSink: sink}
	b.dispatcher(t, Config{Sink: rec, BatchSize: 64, Concurrency: 2, PollInterval: 100 * time.Millisecond})
	b.waitStatus(t, StatusSent, n, 2*time.Minute)
	snap := col.WaitDistinct(t, n, time.Minute)
	for _, id := range ids {
		require.Equal(t, 1, snap.Counts[id], "row %s", id)
	}
	batched, largest := rec.sizes()
	require.Positive(t, batched)
	require.Greater(t, largest*size, 4<<20, "a batch above the broker's limit was tried first")
	var retries int
	require.NoError(t, b.db.Get(&retries, "SELECT SUM(retry_count) FROM "+b.table.Name()))
	if retries != 0 {
		b.dump(t)
		var codes []string
		_ = b.db.Select(&codes, "SELECT CONCAT(COALESCE(last_error_code, ''), ' ', COALESCE(last_error_message, '')) FROM "+b.table.Name())
		t.Logf("codes %q", codes)
	}
	require.Zero(t, retries, "sent alone within the same attempt")
	t.Logf("refused batch: %d rows of %d KiB, batches of up to %d tried first, then each alone: all SENT, delivered %d", n, size>>10, largest, snap.Total)
}
