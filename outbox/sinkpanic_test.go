package outbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
)

// panicOnce is a receiver in front of which the sink panics on its first
// call, after the receiver took the messages: a send that happened although
// the sink never returned. It records what the receiver took per event id.
type panicOnce struct {
	mu       sync.Mutex
	calls    int
	panicked []string       // event ids of the call that panicked
	got      map[string]int // event id -> times the receiver took it
}

func (p *panicOnce) take(msgs []*Message) {
	p.mu.Lock()
	p.calls++
	first := p.calls == 1
	for _, m := range msgs {
		p.got[m.EventID]++
		if first {
			p.panicked = append(p.panicked, m.EventID)
		}
	}
	p.mu.Unlock()
	if first {
		panic("sink bug after the send")
	}
}

func (p *panicOnce) Send(_ context.Context, m *Message) error {
	p.take([]*Message{m})
	return nil
}

// panicOnceBatch is panicOnce as a BatchSink: one group per claim.
type panicOnceBatch struct{ *panicOnce }

func (p panicOnceBatch) Batches(msgs []*Message) [][]*Message { return [][]*Message{msgs} }

func (p panicOnceBatch) SendBatch(_ context.Context, msgs []*Message) []error {
	p.take(msgs)
	return make([]error, len(msgs))
}

// TestSinkPanicIsUnknown: a sink that panics on its first call (after its
// receiver took the messages) does not stop the dispatcher. The rows of that
// call are recorded RETRY with class unknown and code sink_panic (the send
// may have happened), logged at Error with their event ids and counted as
// unknown results; the retry sends them again with the same event id, and
// they end SENT. Every other row is sent once, SENT at its first attempt.
// Both a plain Sink and a BatchSink (held claims) are checked.
func TestSinkPanicIsUnknown(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *bed) {
		for _, batch := range []bool{false, true} {
			name := "sink"
			if batch {
				name = "batchsink"
			}
			t.Run(name, func(t *testing.T) { testSinkPanicIsUnknown(t, b, batch) })
		}
	})
}

func testSinkPanicIsUnknown(t *testing.T, b *bed, batch bool) {
	// Each subtest uses its own destination; the bed's table is shared by
	// the two subtests, which run one after the other.
	topic := testenv.Name(t, "topic")
	const n = 6
	ids := b.enqueue(t, events(topic, n)...)
	recv := &panicOnce{got: map[string]int{}}
	var sink Sink = recv
	if batch {
		sink = panicOnceBatch{recv}
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	logger, hook := logtest.NewNullLogger()
	var mu sync.Mutex
	outs := map[string][]Outcome{}
	d := b.dispatcher(t, Config{Sink: sink, PollInterval: 20 * time.Millisecond, BackoffBase: time.Millisecond,
		BackoffMax: 5 * time.Millisecond, MaxRetries: 5, Observe: observe.Observe{Logger: logger, Metrics: m},
		OnOutcome: func(o Outcome) {
			mu.Lock()
			outs[o.EventID] = append(outs[o.EventID], o)
			mu.Unlock()
		}})
	testenv.Eventually(t, time.Minute, "every row of "+topic+" SENT", func() bool {
		for _, id := range ids {
			row, err := b.table.Get(context.Background(), b.db, id)
			require.NoError(t, err)
			if row.Status != StatusSent {
				return false
			}
		}
		return true
	})
	// The dispatcher survived: a row enqueued afterwards is sent too.
	later := b.enqueue(t, events(topic, 1)...)
	d.Notify()
	testenv.Eventually(t, time.Minute, "the later row SENT", func() bool {
		row, err := b.table.Get(context.Background(), b.db, later[0])
		require.NoError(t, err)
		return row.Status == StatusSent
	})
	ids = append(ids, later...)

	recv.mu.Lock()
	panicked := append([]string(nil), recv.panicked...)
	got := map[string]int{}
	for k, v := range recv.got {
		got[k] = v
	}
	recv.mu.Unlock()
	require.NotEmpty(t, panicked)
	isPanicked := map[string]bool{}
	for _, id := range panicked {
		isPanicked[id] = true
	}
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		row, err := b.table.Get(context.Background(), b.db, id)
		require.NoError(t, err)
		require.Equal(t, StatusSent, row.Status, id)
		o := outs[id]
		if !isPanicked[id] {
			require.Equal(t, 1, got[id], "a row the panic did not touch is sent once: %s", id)
			require.Zero(t, row.RetryCount, id)
			require.Len(t, o, 1, id)
			require.Equal(t, StatusSent, o[0].Status, id)
			continue
		}
		// Sent in the panicking call and again on the retry: a duplicate
		// the consumer absorbs by event id.
		require.Equal(t, 2, got[id], id)
		require.Equal(t, 1, row.RetryCount, id)
		require.Len(t, o, 2, id)
		require.Equal(t, StatusRetry, o[0].Status, id)
		require.Equal(t, 1, o[0].Attempt, id)
		require.Equal(t, ClassUnknown, ClassOf(o[0].Err), id)
		require.Equal(t, "sink_panic", CodeOf(o[0].Err), id)
		require.ErrorContains(t, o[0].Err, "sink bug after the send")
		require.Equal(t, StatusSent, o[1].Status, id)
		require.Equal(t, 2, o[1].Attempt, id)
	}

	st := d.Stats()
	require.EqualValues(t, len(panicked), st.Unknown)
	require.Zero(t, st.Retried+st.Dead)
	// counted per row of the call that panicked
	unknown := testutil.ToFloat64(m.OutboxSends.WithLabelValues(topic, "ThingHappened", "unknown", "unknown"))
	require.Equal(t, float64(len(panicked)), unknown)
	require.Zero(t, testutil.ToFloat64(m.OutboxSends.WithLabelValues(topic, "ThingHappened", "retry", "transient")))

	// Logged once at Error, with the event ids and never the payload.
	var errLines []*logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.ErrorLevel {
			errLines = append(errLines, e)
		}
	}
	require.Len(t, errLines, 1)
	e := errLines[0]
	require.Contains(t, e.Message, "sink panicked")
	if len(panicked) == 1 {
		require.Equal(t, panicked[0], e.Data["event_id"])
	} else {
		require.ElementsMatch(t, panicked, e.Data["event_ids"])
	}
	line, err := e.String()
	require.NoError(t, err)
	require.NotContains(t, line, `{"n":`, "no payload in the log")
	t.Logf("sink panic (batch %v): %d of %d rows in the panicking call, RETRY unknown/sink_panic then SENT; others sent once; log %q",
		batch, len(panicked), len(ids), e.Message)
}
