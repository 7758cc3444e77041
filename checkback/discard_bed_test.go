package checkback_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/txlog"
)

// discardWait bounds waiting for the test broker to discard a half message:
// transactionTimeOut (3 s) + transactionCheckMax (5) x interval (2 s) is
// about 13 s, plus recovery reading DiscardTopic from its first offset.
const discardWait = 90 * time.Second

// discardBed has a producer group whose half messages the real broker
// discards: its transactional producer runs a per-event local action, then
// answers UNKNOWN to the send and to every check, so after
// transactionCheckMax checks the half lands in TRANS_CHECK_MAX_TIME_TOPIC.
type discardBed struct {
	s     testenv.Settings
	db    *sqlx.DB
	store *txlog.Store
	group string
	topic string
	coll  *testenv.Collector
	tp    rocketmq.TransactionProducer
	l     *unknownListener
}

type unknownListener struct {
	mu      sync.Mutex
	actions map[string]func() error
	errs    map[string]error
}

func (l *unknownListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	id := m.GetProperty(envelope.PropEventID)
	l.mu.Lock()
	act := l.actions[id]
	l.mu.Unlock()
	if act != nil {
		err := act()
		l.mu.Lock()
		l.errs[id] = err
		l.mu.Unlock()
	}
	return primitive.UnkonwnState
}

func (l *unknownListener) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	return primitive.UnkonwnState
}

func newDiscardBed(t *testing.T) *discardBed {
	t.Helper()
	s := testenv.Integration(t)
	db := testenv.DB(t)
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(context.Background()))
	b := &discardBed{s: s, db: db, store: store, group: testenv.Name(t, "txg"), topic: testenv.Name(t, "topic"),
		l: &unknownListener{actions: map[string]func() error{}, errs: map[string]error{}}}
	// One queue: a marker sent after the events is delivered after them.
	testenv.CreateTopic(t, b.topic, 1)
	b.coll = testenv.Collect(t, b.topic)
	tp, err := rocketmq.NewTransactionProducer(b.l,
		producer.WithNsResolver(s.NameServerResolver()),
		producer.WithGroupName(b.group),
		producer.WithInstanceName(b.group),
		producer.WithRetry(2),
	)
	require.NoError(t, err)
	require.NoError(t, tp.Start())
	t.Cleanup(func() { _ = tp.Shutdown() })
	b.tp = tp
	return b
}

// Local actions run inside the half message's local-transaction callback.
type localAction int

const (
	commitRow          localAction = iota // a COMMITTED row, as txproducer writes it
	commitRowNoPayload                    // COMMITTED, payload storage disabled
	rollbackRow                           // a persisted local rollback
	noRow                                 // the local transaction never ran
)

func (b *discardBed) payload(id string) []byte { return []byte(`{"order":"` + id + `"}`) }

// sendHalf sends a half message for a new event id and runs action as its
// local transaction; the broker discards the half some 13 s later.
func (b *discardBed) sendHalf(t *testing.T, action localAction) string {
	t.Helper()
	id := envelope.NewEventID()
	body := b.payload(id)
	props := envelope.Envelope{EventID: id, EventType: "OrderPlaced", BusinessKey: "order-" + id[:8]}.Properties(body)
	js, err := json.Marshal(props)
	require.NoError(t, err)
	row := txlog.Row{EventID: id, ProducerGroup: b.group, Topic: b.topic, Tags: "placed", Keys: id, EventType: "OrderPlaced",
		State: txlog.StateCommitted, Payload: body, PayloadHash: props[envelope.PropPayloadHash], Properties: string(js),
		BusinessKey: props[envelope.PropBusinessKey], ResolvedBy: txlog.ByLocalCommit}
	switch action {
	case commitRowNoPayload:
		row.Payload = nil
	case rollbackRow:
		row.State, row.Payload, row.ResolvedBy = txlog.StateRolledBack, nil, txlog.ByLocalRollback
	}
	if action != noRow {
		b.l.mu.Lock()
		b.l.actions[id] = func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			tx, err := b.db.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			if err := b.store.Insert(ctx, tx, row); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
		b.l.mu.Unlock()
	}
	m := primitive.NewMessage(b.topic, body)
	m.WithProperties(props)
	m.WithTag("placed")
	m.WithKeys([]string{id})
	res, err := b.tp.SendMessageInTransaction(context.Background(), m)
	require.NoError(t, err)
	require.Equal(t, primitive.SendOK, res.Status)
	require.Equal(t, primitive.UnkonwnState, res.State)
	b.l.mu.Lock()
	require.NoError(t, b.l.errs[id], "local action")
	b.l.mu.Unlock()
	return id
}

// settle sends a marker on the topic (one queue) and waits for it, so that
// every earlier message has been delivered: counts are final afterwards.
func (b *discardBed) settle(t *testing.T) testenv.Snapshot {
	t.Helper()
	marker := envelope.NewEventID()
	m := primitive.NewMessage(b.topic, []byte("marker"))
	m.WithProperty(envelope.PropEventID, marker)
	_, err := testenv.Producer(t).SendSync(context.Background(), m)
	require.NoError(t, err)
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[marker] > 0 }), "marker not delivered")
	return b.coll.Snapshot()
}

func (b *discardBed) row(t *testing.T, id string) txlog.Row {
	t.Helper()
	r, err := b.store.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}

// results records every recovery attempt on the group's messages.
type results struct {
	mu  sync.Mutex
	all []checkback.RecoveryResult
	ch  chan struct{}
}

func newResults() *results { return &results{ch: make(chan struct{})} }

func (r *results) add(res checkback.RecoveryResult) {
	r.mu.Lock()
	r.all = append(r.all, res)
	close(r.ch)
	r.ch = make(chan struct{})
	r.mu.Unlock()
}

func (r *results) snapshot() []checkback.RecoveryResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]checkback.RecoveryResult(nil), r.all...)
}

// wait blocks until cond holds for the results seen so far.
func (r *results) wait(t *testing.T, timeout time.Duration, what string, cond func([]checkback.RecoveryResult) bool) []checkback.RecoveryResult {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ch := r.ch
		r.mu.Unlock()
		if all := r.snapshot(); cond(all) {
			return all
		}
		select {
		case <-ch:
		case <-deadline.C:
			all := r.snapshot()
			t.Fatalf("timed out after %s waiting for %s; results: %+v", timeout, what, all)
			return nil
		}
	}
}

func decided(id string, d txlog.RecoveryDecision) func([]checkback.RecoveryResult) bool {
	return func(all []checkback.RecoveryResult) bool {
		for _, r := range all {
			if r.EventID == id && r.Err == nil && r.Decision == d {
				return true
			}
		}
		return false
	}
}

func failures(all []checkback.RecoveryResult, id string) int {
	n := 0
	for _, r := range all {
		if r.EventID == id && r.Err != nil {
			n++
		}
	}
	return n
}

// startRecovery starts a real Recovery for the bed's group with short
// retry settings and its own metrics registry.
func (b *discardBed) startRecovery(t *testing.T, log checkback.RecoveryLog, mod func(*checkback.RecoveryConfig)) (*checkback.Recovery, *results, *metrics.Metrics) {
	t.Helper()
	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	res := newResults()
	cfg := checkback.RecoveryConfig{
		NameServers: []string{b.s.NameServer}, Group: b.group, Log: log, StartRetry: 500 * time.Millisecond,
		RetryBackoff: 50 * time.Millisecond, RetryMaxBackoff: 200 * time.Millisecond, QueryTimeout: time.Second,
		Metrics: m, OnDecision: res.add,
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := checkback.NewRecovery(cfg)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, r.Shutdown(ctx))
	})
	return r, res, m
}

func undecided(m *metrics.Metrics, group string) float64 {
	return testutil.ToFloat64(m.DiscardUndecided.WithLabelValues(group))
}

func counter(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }
