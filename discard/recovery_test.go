package discard_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

type fakePublisher struct {
	mu   sync.Mutex
	sent []*primitive.Message
	fail int // fail this many sends first
}

func (p *fakePublisher) SendSync(_ context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fail > 0 {
		p.fail--
		return nil, errors.New("broker unreachable")
	}
	p.sent = append(p.sent, msgs...)
	return &primitive.SendResult{Status: primitive.SendOK, MsgID: fmt.Sprintf("m%d", len(p.sent))}, nil
}

func (p *fakePublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sent)
}

// discarded builds a message as the broker stores it in Topic: the half
// whose UNIQ_KEY (u1) committedRow records.
func discarded(group, id string, body []byte) *primitive.MessageExt {
	return discardedHalf(group, id, "u1", body)
}

// discardedHalf is discarded for the half message whose UNIQ_KEY is half.
func discardedHalf(group, id, half string, body []byte) *primitive.MessageExt {
	m := &primitive.MessageExt{Message: primitive.Message{Topic: discard.Topic, Body: body}}
	props := wire.Envelope{EventID: id, EventType: "T"}.Properties(body)
	for k, v := range map[string]string{
		"REAL_TOPIC": "orders", "REAL_QID": "0", "TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": half,
		"__transactionId__": half, "TRANSACTION_CHECK_TIMES": "5", "KEYS": id, "TAGS": "tag",
	} {
		props[k] = v
	}
	m.WithProperties(props) // replaces the whole map
	return m
}

// redelivered makes m look like the broker's copy after one consumer retry
// of the recovery group: REAL_TOPIC names the retry topic.
func redelivered(m *primitive.MessageExt) *primitive.MessageExt {
	m.ReconsumeTimes = 1
	m.WithProperty("RETRY_TOPIC", discard.Topic)
	m.WithProperty("REAL_TOPIC", "%RETRY%g-recovery")
	return m
}

// committedRow is the row txproducer writes for a committed event: its
// properties record the UNIQ_KEY (u1) of the half that committed it.
func committedRow(id, topic string, body []byte) txlog.Row {
	props := wire.Envelope{EventID: id, EventType: "T", Headers: map[string]string{"tenant": "t1"}}.Properties(body)
	props["UNIQ_KEY"] = "u1"
	js, _ := json.Marshal(props)
	return txlog.Row{EventID: id, ProducerGroup: "g", Topic: topic, Tags: "tag", Keys: "k1 " + id, EventType: "T",
		State: txlog.StateCommitted, Payload: body, PayloadHash: wire.Hash(body), Properties: string(js), ResolvedBy: txlog.ByLocalCommit}
}

func recovery(t *testing.T, log discard.Log, pub discard.Publisher, mods ...func(*discard.Config)) *discard.Recovery {
	t.Helper()
	cfg := discard.Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Log: log, Publisher: pub}
	for _, m := range mods {
		m(&cfg)
	}
	r, err := discard.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func TestRecoveryDecisions(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	log := newFakeLog()
	log.rows["c"] = committedRow("c", "orders", body)
	log.rows["r"] = txlog.Row{EventID: "r", State: txlog.StateRolledBack}
	log.rows["x"] = txlog.Row{EventID: "x", State: txlog.StateCommitted, PayloadHash: "other"}
	pub := &fakePublisher{}
	r := recovery(t, log, pub)
	ctx := context.Background()

	res, err := r.Handle(ctx, discarded("g", "c", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryRepublished, res.Decision)
	require.Len(t, pub.sent, 1)
	m := pub.sent[0]
	require.Equal(t, "orders", m.Topic)
	require.Equal(t, body, m.Body)
	require.Equal(t, "c", m.GetProperty(wire.PropEventID), "same event id")
	require.Equal(t, "u1", m.GetProperty("UNIQ_KEY"))
	require.Equal(t, "tag", m.GetTags())
	for _, k := range []string{"TRAN_MSG", "PGROUP", "REAL_TOPIC", "REAL_QID", "__transactionId__", "TRANSACTION_CHECK_TIMES"} {
		require.Empty(t, m.GetProperty(k), k)
	}
	// A second discarded copy of the same transaction is not published again.
	res, err = r.Handle(ctx, discarded("g", "c", body))
	require.NoError(t, err)
	require.Empty(t, res.Decision)
	require.Len(t, pub.sent, 1)

	res, err = r.Handle(ctx, discarded("g", "r", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryDropped, res.Decision)

	res, err = r.Handle(ctx, discarded("g", "missing", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryFenced, res.Decision)
	require.Equal(t, txlog.StateRolledBack, log.rows["missing"].State)
	require.Equal(t, txlog.ByRecovery, log.rows["missing"].ResolvedBy)
	require.Equal(t, "orders", log.rows["missing"].Topic, "a first delivery's REAL_TOPIC is the broker's own")

	res, err = r.Handle(ctx, discarded("g", "x", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryConflict, res.Decision)

	res, err = r.Handle(ctx, discarded("other-group", "c2", body))
	require.NoError(t, err)
	require.Empty(t, res.Decision)
	require.Len(t, pub.sent, 1, "nothing else was published")
	require.Equal(t, map[string]txlog.RecoveryDecision{"c": txlog.RecoveryRepublished, "r": txlog.RecoveryDropped,
		"missing": txlog.RecoveryFenced, "x": txlog.RecoveryConflict}, log.recovered)
}

// A message that came back through the recovery group's retry topic carries
// REAL_TOPIC=%RETRY%...: the republish is built from the row only, and a
// fence row does not record the retry topic.
func TestRecoveryIgnoresTravelledRealTopic(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":2}`)
	log := newFakeLog()
	row := committedRow("c", "orders", body)
	log.rows["c"] = row
	pub := &fakePublisher{}
	r := recovery(t, log, pub)
	ctx := context.Background()

	m := redelivered(discarded("g", "c", body))
	m.WithProperty("RMQTX_STRAY", "from the travelled message")
	res, err := r.Handle(ctx, m)
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryRepublished, res.Decision)
	require.True(t, res.Redelivered)
	require.Equal(t, "orders", res.Topic)
	require.Len(t, pub.sent, 1)
	out := pub.sent[0]
	require.Equal(t, "orders", out.Topic, "the row's topic, not REAL_TOPIC")
	require.Equal(t, body, out.Body)
	require.Equal(t, "tag", out.GetTags())
	require.Equal(t, "k1 c", out.GetKeys())
	require.Equal(t, "t1", out.GetProperty(wire.HeaderPrefix+"tenant"), "the envelope comes from the row's properties")
	require.Equal(t, wire.Hash(body), out.GetProperty(wire.PropPayloadHash))
	require.Empty(t, out.GetProperty("RMQTX_STRAY"), "nothing is copied from the travelled message")
	for _, k := range []string{"RETRY_TOPIC", "REAL_TOPIC", "RECONSUME_TIME", "PGROUP"} {
		require.Empty(t, out.GetProperty(k), k)
	}

	res, err = r.Handle(ctx, redelivered(discarded("g", "gone", body)))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryFenced, res.Decision)
	require.Empty(t, log.rows["gone"].Topic, "the retry topic is never recorded as the event's topic")
	require.Equal(t, txlog.StateRolledBack, log.rows["gone"].State)
	require.Len(t, pub.sent, 1)
}

// A COMMITTED row without a stored payload is not republished from the
// travelled body: it gets its own decision, an Error log and a metric.
func TestRecoveryCommittedWithoutPayload(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":3}`)
	log := newFakeLog()
	for id, mod := range map[string]func(*txlog.Row){
		"nopayload": func(r *txlog.Row) { r.Payload = nil },
		"corrupt":   func(r *txlog.Row) { r.Payload = []byte(`{"a":4}`) },
		"notopic":   func(r *txlog.Row) { r.Topic = "" },
		"badprops":  func(r *txlog.Row) { r.Properties = `{"RMQTX_EVENT_VERSION":2}` },
	} {
		row := committedRow(id, "orders", body)
		mod(&row)
		log.rows[id] = row
	}
	pub := &fakePublisher{}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	logger, hook := test.NewNullLogger()
	r := recovery(t, log, pub, func(c *discard.Config) { c.Metrics, c.Logger = m, logger })
	for _, id := range []string{"nopayload", "corrupt", "notopic", "badprops"} {
		res, err := r.Handle(context.Background(), discarded("g", id, body))
		require.NoError(t, err, id)
		require.Equal(t, txlog.RecoveryNoPayload, res.Decision, id)
		require.Equal(t, txlog.RecoveryNoPayload, log.recovered[id], id)
		// A second copy is not decided (nor alerted) again.
		res, err = r.Handle(context.Background(), discarded("g", id, body))
		require.NoError(t, err)
		require.Empty(t, res.Decision)
	}
	require.Zero(t, pub.count(), "never republished from the discarded message's body")
	require.Equal(t, 4.0, testutil.ToFloat64(m.DiscardRecoveries.WithLabelValues("g", "no_payload")))
	var errs int
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.ErrorLevel {
			errs++
			require.NotContains(t, e.Message+fmt.Sprint(e.Data), string(body), "no payload in logs")
		}
	}
	require.Equal(t, 4, errs)

	// An empty payload that was stored as such is an event like any other.
	empty := committedRow("empty", "orders", nil)
	log.rows["empty"] = empty
	res, err := r.Handle(context.Background(), discarded("g", "empty", nil))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryRepublished, res.Decision)
}

// Recovery retries a message in process, with a bounded backoff, until it
// is decided: far past the client's 16 reconsumes. The gauge of undecided
// halves is 1 meanwhile and 0 afterwards; a failed republish is retried
// and sent once; a republish whose MarkRecovered failed is not sent again.
func TestRecoveryRetriesUntilDecided(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":5}`)
	log := newFakeLog()
	log.rows["c"] = committedRow("c", "orders", body)
	log.failGets.Store(25)
	log.failMarks.Store(2)
	pub := &fakePublisher{fail: 3}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)
	var attempts, maxGauge atomic.Int64
	r := recovery(t, log, pub, func(c *discard.Config) {
		c.Metrics, c.RetryBackoff, c.RetryMaxBackoff = m, time.Millisecond, 5*time.Millisecond
		c.OnDecision = func(res discard.Result) {
			attempts.Store(int64(res.Attempt))
			if g := int64(testutil.ToFloat64(m.DiscardUndecided.WithLabelValues("g"))); g > maxGauge.Load() {
				maxGauge.Store(g)
			}
		}
	})
	require.True(t, r.Decide(discarded("g", "c", body)))
	require.Equal(t, int64(25+3+2+1), attempts.Load(), "25 failed reads, 3 failed sends, 2 failed marks, then decided")
	require.Equal(t, 1, pub.count(), "sent once: a failed mark does not send again")
	require.Equal(t, txlog.RecoveryRepublished, log.recovered["c"])
	require.Equal(t, int64(1), maxGauge.Load())
	require.Zero(t, testutil.ToFloat64(m.DiscardUndecided.WithLabelValues("g")))
	require.Equal(t, 30.0, testutil.ToFloat64(m.DiscardRecoveries.WithLabelValues("g", "failed")))
}

// Shutdown stops a message that cannot be decided (database down) promptly;
// the message is handed back, never acknowledged.
func TestRecoveryShutdownStopsRetrying(t *testing.T) {
	t.Parallel()
	log := newFakeLog()
	log.getErr = errors.New("connection refused")
	failed := make(chan struct{}, 1)
	r := recovery(t, log, &fakePublisher{}, func(c *discard.Config) {
		c.RetryBackoff, c.RetryMaxBackoff = time.Hour, time.Hour
		c.OnDecision = func(discard.Result) {
			select {
			case failed <- struct{}{}:
			default:
			}
		}
	})
	done := make(chan bool, 1)
	go func() { done <- r.Decide(discarded("g", "c", []byte("x"))) }()
	<-failed
	require.NoError(t, r.Shutdown(context.Background()))
	select {
	case ok := <-done:
		require.False(t, ok, "not decided: handed back")
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not stop the retry loop")
	}
}

func TestRecoveryBackoffBounds(t *testing.T) {
	t.Parallel()
	r := recovery(t, newFakeLog(), &fakePublisher{}, func(c *discard.Config) {
		c.RetryBackoff, c.RetryMaxBackoff = 100*time.Millisecond, time.Second
	})
	for n := 1; n <= 100; n++ {
		want := min(100*time.Millisecond<<min(n-1, 20), time.Second)
		got := r.Backoff(n)
		require.GreaterOrEqual(t, got, want/2, n)
		require.LessOrEqual(t, got, want, n)
	}
}

func TestRecoveryConfigValidation(t *testing.T) {
	t.Parallel()
	base := discard.Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Log: newFakeLog()}
	c := base
	c.RetryBackoff = -time.Second
	_, err := discard.New(c)
	require.ErrorIs(t, err, discard.ErrConfig)
	require.ErrorContains(t, err, "RetryBackoff")
	c = base
	c.RetryBackoff, c.RetryMaxBackoff = time.Second, time.Millisecond
	_, err = discard.New(c)
	require.ErrorIs(t, err, discard.ErrConfig)
	require.ErrorContains(t, err, "RetryMaxBackoff")
	c = base
	c.RetryBackoff = 10 * time.Second // the cap follows a larger base
	_, err = discard.New(c)
	require.NoError(t, err)
}

func TestRecoveryRetriesOnDatabaseError(t *testing.T) {
	t.Parallel()
	log := newFakeLog()
	log.getErr = context.DeadlineExceeded
	r := recovery(t, log, &fakePublisher{})
	_, err := r.Handle(context.Background(), discarded("g", "c", []byte("x")))
	require.Error(t, err, "a database error asks for redelivery")
}

// Several halves can carry one event id (a retried Send, two Sends racing);
// the row records the UNIQ_KEY of the one that committed. Recovery drops
// any other half whatever it finds first, republishes only the committed
// one (under its own UNIQ_KEY), and records the drop on the row only while
// the row holds no decision: never over REPUBLISHED or NO_PAYLOAD. Each
// drop is counted and logged, without the payload; a second copy of a half
// already recorded is not decided again.
func TestRecoveryDropsOtherHalf(t *testing.T) {
	t.Parallel()
	body := []byte(`{"card":"4111111111111111"}`)
	log := newFakeLog()
	log.rows["e"] = committedRow("e", "orders", body) // committed by half u1
	np := committedRow("np", "orders", body)
	np.Payload = nil
	log.rows["np"] = np
	pub := &fakePublisher{}
	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	logger, hook := test.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	r := recovery(t, log, pub, func(c *discard.Config) { c.Metrics, c.Logger = m, logger })
	ctx := context.Background()
	dropped := func() float64 { return testutil.ToFloat64(m.DiscardRecoveries.WithLabelValues("g", "dropped")) }

	// The losing half first: dropped, and recorded on the row.
	res, err := r.Handle(ctx, discardedHalf("g", "e", "u2", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryDropped, res.Decision)
	require.Equal(t, "u2", res.HalfKey)
	require.Zero(t, pub.count(), "a losing half is never published")
	row := log.row("e")
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Equal(t, txlog.RecoveryDropped, row.RecoveryDecision)
	require.Contains(t, row.RecoveryNote, "u2")
	require.Contains(t, row.RecoveryNote, "u1")
	// A second discarded copy of it: already recorded.
	res, err = r.Handle(ctx, discardedHalf("g", "e", "u2", body))
	require.NoError(t, err)
	require.Empty(t, res.Decision)
	require.Equal(t, 1.0, dropped())

	// The committed half: republished under its own UNIQ_KEY.
	res, err = r.Handle(ctx, discarded("g", "e", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryRepublished, res.Decision)
	require.Equal(t, 1, pub.count())
	require.Equal(t, "u1", pub.sent[0].GetProperty("UNIQ_KEY"))
	require.Equal(t, txlog.RecoveryRepublished, log.row("e").RecoveryDecision)

	// A third half after the republish: dropped and counted, the row keeps
	// the committed half's decision.
	res, err = r.Handle(ctx, discardedHalf("g", "e", "u3", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryDropped, res.Decision)
	require.Equal(t, txlog.RecoveryRepublished, log.row("e").RecoveryDecision)
	require.Equal(t, 2.0, dropped())
	require.Equal(t, 1, pub.count())

	// NO_PAYLOAD stays on the row whatever other half comes after it: the
	// list of committed events an operator must publish stays whole.
	res, err = r.Handle(ctx, discarded("g", "np", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryNoPayload, res.Decision)
	marks := log.marks
	res, err = r.Handle(ctx, discardedHalf("g", "np", "u2", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryDropped, res.Decision)
	res, err = r.Handle(ctx, discarded("g", "np", []byte(`{"other":1}`)))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryConflict, res.Decision)
	require.Equal(t, txlog.RecoveryNoPayload, log.row("np").RecoveryDecision)
	require.Equal(t, marks, log.marks, "nothing written over NO_PAYLOAD")
	require.Equal(t, 1, pub.count(), "only e's committed half was ever published")

	var drops int
	for _, e := range hook.AllEntries() {
		require.NotContains(t, e.Message+fmt.Sprint(e.Data), "4111", "no payload in logs")
		if e.Data["decision"] == txlog.RecoveryDropped {
			drops++
		}
	}
	require.Equal(t, 3, drops, "every drop is logged")
}

func TestRecoveryShutdownIdempotent(t *testing.T) {
	t.Parallel()
	r := recovery(t, newFakeLog(), &fakePublisher{})
	require.NoError(t, r.Shutdown(context.Background()))
	require.NoError(t, r.Close())
	require.Error(t, r.Start(context.Background()))
}
