package discard_test

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

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// discardWait bounds waiting for the test broker to discard a half message:
// transactionTimeOut (3 s) + transactionCheckMax (32, so that the default
// FenceAge fits) x interval (2 s) is about 67 s, plus recovery reading
// DiscardTopic from its first offset.
const discardWait = 150 * time.Second

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
	// commit lists the UNIQ_KEYs of halves whose local transaction
	// commits (the send answers COMMIT); every other half is answered
	// UNKNOWN, and so is every check of any half but these.
	commit map[string]bool
	// checksOfCommitted counts the checks of those committed halves.
	checksOfCommitted int
}

func (l *unknownListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	id := m.GetProperty(wire.PropEventID)
	l.mu.Lock()
	act := l.actions[id]
	l.mu.Unlock()
	if act != nil {
		err := act()
		l.mu.Lock()
		l.errs[id] = err
		l.mu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.commit[m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex)] {
		return primitive.CommitMessageState
	}
	return primitive.UnkonwnState
}

func (l *unknownListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.commit[m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex)] {
		// A half already committed by its end-transaction is checked again
		// when the broker checks before it wrote the commit's op record
		// (the test broker's transactionTimeOut, 3 s, is not above its op
		// batch interval). COMMIT would make the broker store the event
		// again, UNKNOWN would make it discard the committed half: both
		// copies of the broker's own, not recovery's. ROLLBACK of a
		// committed half only closes it, so the topic shows what recovery
		// did and nothing else.
		l.checksOfCommitted++
		return primitive.RollbackMessageState
	}
	return primitive.UnkonwnState
}

// eachDB runs body on a fresh discardBed on each database
// (testenv.EachDB), the two as parallel subtests.
func eachDB(t *testing.T, body func(t *testing.T, b *discardBed)) {
	t.Helper()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		body(t, newDiscardBed(t, db))
	})
}

// newDiscardBed migrates db (a fresh database) and starts the bed's
// producer, topic and collector.
func newDiscardBed(t *testing.T, db *sqlx.DB) *discardBed {
	t.Helper()
	s := testenv.Integration(t)
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
	b := &discardBed{s: s, db: db, store: store, group: testenv.Name(t, "txg"), topic: testenv.Name(t, "topic"),
		l: &unknownListener{actions: map[string]func() error{}, errs: map[string]error{}, commit: map[string]bool{}}}
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
// local transaction; the broker discards the half some 67 s later.
func (b *discardBed) sendHalf(t *testing.T, action localAction) string {
	t.Helper()
	id := wire.NewEventID()
	body := b.payload(id)
	props := wire.Envelope{EventID: id, EventType: "OrderPlaced", BusinessKey: "order-" + id[:8]}.Properties(body)
	js, err := json.Marshal(props)
	require.NoError(t, err)
	row := txlog.Row{EventID: id, ProducerGroup: b.group, Topic: b.topic, Tags: "placed", Keys: id, EventType: "OrderPlaced",
		State: txlog.StateCommitted, Payload: body, PayloadHash: props[wire.PropPayloadHash], Properties: string(js),
		BusinessKey: props[wire.PropBusinessKey], ResolvedBy: txlog.ByLocalCommit}
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

// sendRacingHalves sends two half messages with one event id, as two Sends
// racing on that id do. The winner's local transaction writes the
// COMMITTED row, which records the winner's UNIQ_KEY as txproducer's does,
// and its end-transaction commits it: the event is on the topic once. The
// loser's local transaction never wrote a row (in txproducer it fails on
// the duplicate key and answers ROLLBACK); here that answer is lost and no
// producer answers its checks, so the broker discards it some 67 s later.
func (b *discardBed) sendRacingHalves(t *testing.T) (id, winner, loser string) {
	t.Helper()
	id = wire.NewEventID()
	winner, loser = primitive.CreateUniqID(), primitive.CreateUniqID()
	body := b.payload(id)
	props := wire.Envelope{EventID: id, EventType: "OrderPlaced", BusinessKey: "order-" + id[:8]}.Properties(body)
	rowProps := map[string]string{primitive.PropertyUniqueClientMessageIdKeyIndex: winner}
	for k, v := range props {
		rowProps[k] = v
	}
	js, err := json.Marshal(rowProps)
	require.NoError(t, err)
	row := txlog.Row{EventID: id, ProducerGroup: b.group, Topic: b.topic, Tags: "placed", Keys: id, EventType: "OrderPlaced",
		State: txlog.StateCommitted, Payload: body, PayloadHash: props[wire.PropPayloadHash], Properties: string(js),
		BusinessKey: props[wire.PropBusinessKey], ResolvedBy: txlog.ByLocalCommit}
	b.l.mu.Lock()
	b.l.commit[winner] = true
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
	send := func(half string) primitive.LocalTransactionState {
		m := primitive.NewMessage(b.topic, body)
		m.WithProperties(props)
		m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, half)
		m.WithTag("placed")
		m.WithKeys([]string{id})
		res, err := b.tp.SendMessageInTransaction(context.Background(), m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		require.Equal(t, half, res.MsgID, "the client keeps a preset UNIQ_KEY")
		return res.State
	}
	require.Equal(t, primitive.CommitMessageState, send(winner))
	b.l.mu.Lock()
	require.NoError(t, b.l.errs[id], "the winner's local transaction")
	delete(b.l.actions, id) // the loser's local transaction writes nothing
	b.l.mu.Unlock()
	require.Equal(t, primitive.UnkonwnState, send(loser))
	return id, winner, loser
}

// settle sends a marker on the topic (one queue) and waits for it, so that
// every earlier message has been delivered: counts are final afterwards.
func (b *discardBed) settle(t *testing.T) testenv.Snapshot {
	t.Helper()
	marker := wire.NewEventID()
	m := primitive.NewMessage(b.topic, []byte("marker"))
	m.WithProperty(wire.PropEventID, marker)
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
	all []discard.Result
	ch  chan struct{}
}

func newResults() *results { return &results{ch: make(chan struct{})} }

func (r *results) add(res discard.Result) {
	r.mu.Lock()
	r.all = append(r.all, res)
	close(r.ch)
	r.ch = make(chan struct{})
	r.mu.Unlock()
}

func (r *results) snapshot() []discard.Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]discard.Result(nil), r.all...)
}

// wait blocks until cond holds for the results seen so far.
func (r *results) wait(t *testing.T, timeout time.Duration, what string, cond func([]discard.Result) bool) []discard.Result {
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

func decided(id string, d txlog.RecoveryDecision) func([]discard.Result) bool {
	return func(all []discard.Result) bool {
		for _, r := range all {
			if r.EventID == id && r.Err == nil && r.Decision == d {
				return true
			}
		}
		return false
	}
}

// decidedHalf is decided for one half message of the event.
func decidedHalf(id, half string, d txlog.RecoveryDecision) func([]discard.Result) bool {
	return func(all []discard.Result) bool {
		for _, r := range all {
			if r.EventID == id && r.HalfKey == half && r.Err == nil && r.Decision == d {
				return true
			}
		}
		return false
	}
}

func failures(all []discard.Result, id string) int {
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
func (b *discardBed) startRecovery(t *testing.T, log discard.Log, mod func(*discard.Config)) (*discard.Recovery, *results, *metrics.Metrics) {
	t.Helper()
	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	res := newResults()
	cfg := discard.Config{
		NameServers: []string{b.s.NameServer}, Group: b.group, Log: log, StartRetry: 500 * time.Millisecond,
		RetryBackoff: 50 * time.Millisecond, RetryMaxBackoff: 200 * time.Millisecond, QueryTimeout: time.Second,
		Observe: observe.Observe{Metrics: m}, OnDecision: res.add,
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := discard.New(cfg)
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
