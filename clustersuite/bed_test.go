//go:build failpoints

package clustersuite

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/internal/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

const (
	// fenceAge fits the private brokers (transactionTimeOut 3 s, check
	// interval 2 s, max 5 checks, the same on both): FenceAge + interval <
	// timeout + (max-1) x interval, 4 + 2 < 3 + 8.
	fenceAge        = 4 * time.Second
	eventType       = "OrderPlaced"
	queuesPerBroker = 4
)

var errBusiness = errors.New("clustersuite: business rule says no")

// bed is one scenario's world on the cluster: a fresh database holding the
// producer's txlog, the outbox, the consumer tables and two business tables,
// one topic with queues on both brokers, one producer group and one
// consumer group. orders is written by every local transaction; effects by
// the consumers' handler, without a unique key, so a double effect shows.
type bed struct {
	t      *testing.T
	s      testenv.Settings
	db     *sqlx.DB
	dbName string
	topic  string
	pgroup string
	cgroup string
	route  []remoting.RouteBroker
	store  *txlog.Store
	obx    outbox.Table
	coll   *testenv.Collector
	sc     *scenario
	start  time.Time

	mu        sync.Mutex
	attempts  map[string]*attempt
	answers   map[string][]answer // event id -> check answers, in order
	recovered map[string][]checkback.RecoveryResult
	procs     []*consumer.Processor
	sendErrs  map[string]int // error class -> count
}

// attempt is one transaction the test started.
type attempt struct {
	id       string
	source   string // "tx", "outbox", or "crash:<failpoint>" (a child killed at that failpoint)
	broker   string // crash attempts: the broker that stored the half
	rollback bool   // the business function rolls back on purpose
	state    txproducer.State
	err      error
	answered bool // Send (or the outbox commit) returned
}

// answer is one check answer given by a producer of the bed.
type answer struct {
	producer string
	decision checkback.Decision
	at       time.Time
}

func newBed(t *testing.T, name string) *bed {
	t.Helper()
	s := testenv.Integration(t)
	require.NotNil(t, private, "the cluster tests need the suite's private cluster (started by TestMain)")
	db := testenv.DB(t)
	db.SetMaxOpenConns(48)
	db.SetMaxIdleConns(48)
	ctx := context.Background()
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, consumer.Migrate(ctx, db, ""))
	obx, err := outbox.NewTable("")
	require.NoError(t, err)
	require.NoError(t, obx.Migrate(ctx, db))
	for _, q := range []string{
		`CREATE TABLE orders (event_id VARCHAR(64) NOT NULL PRIMARY KEY, source VARCHAR(32) NOT NULL)`,
		`CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL, consumer VARCHAR(64) NOT NULL,
			agg VARCHAR(64) NOT NULL DEFAULT '', ver BIGINT NOT NULL DEFAULT 0, KEY (event_id))`,
	} {
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	b := &bed{
		t: t, s: s, db: db, dbName: testenv.DBName(t, db), store: store, obx: obx,
		topic: testenv.Name(t, "topic"), pgroup: testenv.Name(t, "pg"), cgroup: testenv.Name(t, "cg"),
		sc: &scenario{Name: name}, start: time.Now(),
		attempts: map[string]*attempt{}, answers: map[string][]answer{}, recovered: map[string][]checkback.RecoveryResult{},
		sendErrs: map[string]int{},
	}
	b.route = testenv.CreateClusterTopic(t, b.topic, queuesPerBroker)
	require.Len(t, b.route, 2, "the topic has queues on both brokers: %v", b.route)
	b.coll = testenv.Collect(t, b.topic)
	t.Cleanup(func() {
		b.sc.Duration = time.Since(b.start)
		report.add(b.sc)
	})
	return b
}

// brokerName names the broker at addr as services.sh does.
func brokerName(addr string) string {
	switch addr {
	case brokerA:
		return "broker-a"
	case brokerB:
		return "broker-b"
	}
	return addr
}

// ---------- producers ----------

func (b *bed) producerConfig(label string) txproducer.Config {
	return txproducer.Config{
		NameServers:        []string{b.s.NameServer},
		Group:              b.pgroup,
		DB:                 b.db,
		FenceAge:           fenceAge,
		CheckTimeout:       10 * time.Second,
		WarmupTopics:       []string{b.topic},
		RecoveryStartRetry: time.Second,
		OnCheck: func(a checkback.Answer) {
			b.mu.Lock()
			b.answers[a.EventID] = append(b.answers[a.EventID], answer{producer: label, decision: a.Decision, at: time.Now()})
			b.mu.Unlock()
		},
		OnRecovery: func(r checkback.RecoveryResult) {
			if r.EventID == "" {
				return
			}
			b.mu.Lock()
			b.recovered[r.EventID] = append(b.recovered[r.EventID], r)
			b.mu.Unlock()
		},
	}
}

func (b *bed) startProducer(t *testing.T, label string, mod func(*txproducer.Config)) *txproducer.Producer {
	t.Helper()
	cfg := b.producerConfig(label)
	if mod != nil {
		mod(&cfg)
	}
	p, err := txproducer.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	return p
}

// insertOrder is the business part of every local transaction.
func insertOrder(id, source string, rollback bool) txproducer.LocalTxFunc {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (event_id, source) VALUES (?, ?)", id, source); err != nil {
			return err
		}
		if rollback {
			return errBusiness
		}
		return nil
	}
}

func payload(id string) []byte { return []byte(`{"order":"` + id + `","amount":42}`) }

func message(topic, id string) txproducer.Message {
	return txproducer.Message{Topic: topic, EventID: id, EventType: eventType, BusinessKey: "order-" + id[len(id)-8:],
		Headers: map[string]string{"suite": "clustersuite"}, Payload: payload(id)}
}

func (b *bed) record(a *attempt) {
	b.mu.Lock()
	b.attempts[a.id] = a
	b.mu.Unlock()
}

// classify names the class of a Send error and reports whether it is one of
// the library's typed errors.
func classify(err error) (string, bool) {
	for _, c := range []struct {
		name string
		err  error
	}{
		{"ErrSend", txproducer.ErrSend}, {"ErrDatabase", txproducer.ErrDatabase},
		{"ErrCommitUnknown", txproducer.ErrCommitUnknown}, {"ErrFenced", txproducer.ErrFenced},
		{"ErrLocalTx", txproducer.ErrLocalTx}, {"ErrClosed", txproducer.ErrClosed},
		{"ErrEventIDConflict", txproducer.ErrEventIDConflict},
	} {
		if errors.Is(err, c.err) {
			return c.name, true
		}
	}
	return "untyped", false
}

// sendTx runs one transactional Send and records it.
func (b *bed) sendTx(ctx context.Context, p *txproducer.Producer, rollback bool) error {
	_, err := b.sendTxID(ctx, p, rollback)
	return err
}

// sendTxID is sendTx, returning the event id too.
func (b *bed) sendTxID(ctx context.Context, p *txproducer.Producer, rollback bool) (string, error) {
	id := envelope.NewEventID()
	a := &attempt{id: id, source: "tx", rollback: rollback}
	b.record(a)
	res, err := p.Send(ctx, message(b.topic, id), insertOrder(id, "tx", rollback))
	b.mu.Lock()
	a.state, a.err, a.answered = res.State, err, true
	if err != nil && !(rollback && errors.Is(err, txproducer.ErrLocalTx)) {
		name, _ := classify(err)
		b.sendErrs[name]++
	}
	b.mu.Unlock()
	return id, err
}

// outboxEvent is one outbox row's event; agg pins it to a queue through
// the sink's sharding key.
func (b *bed) outboxEvent(id, agg string, version int64) outbox.Event {
	if id == "" {
		id = envelope.NewEventID()
	}
	e := outbox.Event{EventID: id, EventType: eventType, Destination: b.topic,
		MessageKey: "order-" + id[len(id)-8:], Payload: payload(id), Headers: map[string]string{"suite": "clustersuite"}}
	if agg != "" {
		e.AggregateType, e.AggregateID, e.AggregateVersion = "Order", agg, version
	}
	return e
}

// enqueueOutbox writes an order and its outbox row in one business
// transaction and records it.
func (b *bed) enqueueOutbox(ctx context.Context, e outbox.Event, rollback bool, d *outbox.Dispatcher) error {
	if e.EventID == "" {
		e.EventID = envelope.NewEventID()
	}
	a := &attempt{id: e.EventID, source: "outbox", rollback: rollback}
	b.record(a)
	err := func() error {
		tx, err := b.db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (event_id, source) VALUES (?, ?)", e.EventID, "outbox"); err != nil {
			return err
		}
		if _, err := b.obx.Enqueue(ctx, tx, e); err != nil {
			return err
		}
		if rollback {
			return errBusiness
		}
		return tx.Commit()
	}()
	b.mu.Lock()
	a.err, a.answered = err, true
	if err != nil && !errors.Is(err, errBusiness) {
		b.sendErrs["outbox enqueue (database)"]++
	}
	b.mu.Unlock()
	if err == nil && d != nil {
		d.Notify()
	}
	return err
}

// ---------- consumers and dispatchers ----------

// handler applies the business effect: one effects row per run.
func handler(name string) consumer.Handler {
	return func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO effects (event_id, consumer, agg, ver) VALUES (?, ?, ?, ?)",
			ev.ID, name, ev.AggregateID, ev.AggregateVersion)
		return err
	}
}

func (b *bed) startConsumer(t *testing.T, name string) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(consumer.Config{
		ProcessorConfig: consumer.ProcessorConfig{
			Group: b.cgroup, DB: b.db,
			Routes:     map[string]consumer.Route{eventType: {Handler: handler(name)}},
			MaxRetries: 200, // outages are long; the bound is not what is tested here
			DelayLevel: func(consumer.Class, int) int { return 1 },
		},
		NameServers: []string{b.s.NameServer},
		Topic:       b.topic,
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Shutdown(ctx)
	})
	b.mu.Lock()
	b.procs = append(b.procs, c.Processor())
	b.mu.Unlock()
	return c
}

func (b *bed) startDispatcher(t *testing.T, cfg outbox.Config) *outbox.Dispatcher {
	t.Helper()
	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{b.s.NameServer}, Group: b.pgroup + "_obx"})
	require.NoError(t, err)
	cfg.DB, cfg.Sink = b.db, sink
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase, cfg.BackoffMax, cfg.MaxRetries = 200*time.Millisecond, 2*time.Second, 10000
	}
	d, err := outbox.NewDispatcher(cfg)
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
		_ = sink.Close()
	})
	return d
}

// ---------- load ----------

// load runs transactional Sends (and every `every`-th an outbox enqueue) on
// several goroutines, paced by limiter, until stop says so. One attempt in
// five rolls back on purpose. After an error a worker waits half a second.
type load struct {
	b         *bed
	producers []*txproducer.Producer
	disp      *outbox.Dispatcher
	every     int
	limiter   *rate.Limiter
	n         atomic.Int64
	ok        atomic.Int64 // Sends and enqueues that committed
	errs      atomic.Int64
	wg        sync.WaitGroup
	cancel    context.CancelFunc
}

func (b *bed) startLoad(producers []*txproducer.Producer, disp *outbox.Dispatcher, every, workers int, lim *rate.Limiter, stop func(l *load) bool) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{b: b, producers: producers, disp: disp, every: every, limiter: lim, cancel: cancel}
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil && !stop(l) {
				if lim != nil && lim.Wait(ctx) != nil {
					return
				}
				i := l.n.Add(1)
				rollback := i%5 == 0
				var err error
				sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
				if l.every > 0 && i%int64(l.every) == 1 {
					err = b.enqueueOutbox(sctx, b.outboxEvent("", "", 0), rollback, l.disp)
				} else {
					err = b.sendTx(sctx, l.producers[int(i)%len(l.producers)], rollback)
				}
				scancel()
				switch {
				case err == nil:
					l.ok.Add(1)
				case rollback && (errors.Is(err, txproducer.ErrLocalTx) || errors.Is(err, errBusiness)):
				default:
					l.errs.Add(1)
					select {
					case <-ctx.Done():
					case <-time.After(500 * time.Millisecond):
					}
				}
			}
		}()
	}
	return l
}

func (l *load) stopAndWait() {
	l.cancel()
	l.wg.Wait()
}

// ---------- verification ----------

type truth struct {
	committed map[string]bool   // txlog COMMITTED or outbox row
	rolled    map[string]bool   // txlog ROLLED_BACK
	orders    map[string]string // event id -> source
	outboxSt  map[string]string // event id -> outbox status
	effects   map[string]int    // event id -> effect rows
}

func (b *bed) readTruth(ctx context.Context) (truth, error) {
	tr := truth{committed: map[string]bool{}, rolled: map[string]bool{}, orders: map[string]string{},
		outboxSt: map[string]string{}, effects: map[string]int{}}
	type kv struct {
		K string `db:"k"`
		V string `db:"v"`
	}
	read := func(q string, f func(kv)) error {
		var rows []kv
		if err := b.db.SelectContext(ctx, &rows, q); err != nil {
			return err
		}
		for _, r := range rows {
			f(r)
		}
		return nil
	}
	if err := read("SELECT event_id AS k, state AS v FROM "+b.store.Table(), func(r kv) {
		if r.V == string(txlog.StateCommitted) {
			tr.committed[r.K] = true
		} else {
			tr.rolled[r.K] = true
		}
	}); err != nil {
		return tr, err
	}
	if err := read("SELECT event_id AS k, status AS v FROM "+b.obx.Name(), func(r kv) {
		tr.committed[r.K] = true
		tr.outboxSt[r.K] = r.V
	}); err != nil {
		return tr, err
	}
	if err := read("SELECT event_id AS k, source AS v FROM orders", func(r kv) { tr.orders[r.K] = r.V }); err != nil {
		return tr, err
	}
	if err := read("SELECT event_id AS k, CAST(COUNT(*) AS CHAR) AS v FROM effects GROUP BY event_id", func(r kv) {
		var n int
		_, _ = fmt.Sscan(r.V, &n)
		tr.effects[r.K] = n
	}); err != nil {
		return tr, err
	}
	return tr, nil
}

// pending are the ids a converged system still owes: committed but not
// applied or not seen by the collector, and outbox rows not yet SENT.
func (b *bed) pending(tr truth, snap testenv.Snapshot) []string {
	var out []string
	for id := range tr.committed {
		if tr.effects[id] == 0 || snap.Counts[id] == 0 {
			out = append(out, id)
		} else if st, ok := tr.outboxSt[id]; ok && st != string(outbox.StatusSent) && st != string(outbox.StatusDead) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// undecided returns the attempts whose outcome the broker may still be
// deciding: Sends that failed ambiguously and halves left by killed
// children, without a txlog row yet.
func (b *bed) undecided(tr truth) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id, a := range b.attempts {
		if a.source == "outbox" || tr.committed[id] || tr.rolled[id] {
			continue
		}
		ambiguous := a.source != "tx" || (a.err != nil && !(a.rollback && errors.Is(a.err, txproducer.ErrLocalTx)))
		if ambiguous {
			out = append(out, id)
		}
	}
	return out
}

// converge waits, bounded by timeout, until nothing is owed: every
// ambiguous attempt has a decision (or provably none: the settle bound
// passed) and every committed event is applied and collected. It returns
// when that happened.
func (b *bed) converge(t *testing.T, timeout time.Duration) time.Time {
	t.Helper()
	ctx := context.Background()
	settleBy := time.Now().Add(fenceAge + 20*time.Second)
	deadline := time.Now().Add(timeout)
	for {
		tr, err := b.readTruth(ctx)
		if err == nil && len(b.pending(tr, b.coll.Snapshot())) == 0 && (len(b.undecided(tr)) == 0 || time.Now().After(settleBy)) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			return time.Now()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// verify waits for convergence, then compares the database's truth with the
// consumers' view, records the figures and asserts lost = ghosts = double
// effects = 0.
func (b *bed) verify(t *testing.T, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	b.converge(t, timeout)
	tr, err := b.readTruth(ctx)
	require.NoError(t, err)
	snap := b.coll.Snapshot()
	undecided := b.undecided(tr)

	sc := b.sc
	b.mu.Lock()
	defer b.mu.Unlock()
	sc.Attempted = len(b.attempts)
	lost, ghosts := map[string]string{}, map[string]string{}
	for id := range tr.committed {
		if _, ok := b.attempts[id]; !ok {
			ghosts[id] = "committed row for an id this test never attempted"
		}
		if tr.effects[id] == 0 {
			lost[id] = "committed, no business effect"
		} else if snap.Counts[id] == 0 {
			lost[id] = "committed, never delivered to the collector"
		}
	}
	for id := range tr.effects {
		if !tr.committed[id] {
			ghosts[id] = "business effect without a commit"
		}
	}
	for id, n := range snap.Counts {
		if !tr.committed[id] && n > 0 {
			ghosts[id] = "delivered without a commit"
		}
		sc.DupDeliver += n - 1
	}
	for id, as := range b.answers {
		for _, a := range as {
			if a.decision == checkback.Commit && !tr.committed[id] {
				ghosts[id] = "check answered COMMIT without a committed row"
			}
		}
	}
	for id, a := range b.attempts {
		if a.source == "tx" && a.answered && a.err == nil && a.state == txproducer.StateCommitted && !tr.committed[id] {
			lost[id] = "Send reported committed, txlog does not"
		}
		if a.rollback && tr.committed[id] {
			ghosts[id] = "business function rolled back, yet committed"
		}
		if tr.committed[id] {
			sc.Committed++
		} else {
			sc.RolledBack++
		}
	}
	inconsistent := 0
	for id := range tr.committed {
		if _, ok := tr.orders[id]; !ok {
			inconsistent++
		}
	}
	for id := range tr.orders {
		if !tr.committed[id] {
			inconsistent++
		}
	}
	sc.Consumed = len(tr.effects)
	for _, n := range tr.effects {
		if n > 1 {
			sc.Double++
		}
	}
	sc.Lost, sc.Ghosts = len(lost), len(ghosts)
	for _, p := range b.procs {
		sc.DupAbsorb += int(p.Stats().Duplicates)
	}
	var parked int
	require.NoError(t, b.db.GetContext(ctx, &parked, "SELECT COUNT(*) FROM rmqtx_dead_letter"))
	if len(b.sendErrs) > 0 {
		var parts []string
		for k, v := range b.sendErrs {
			parts = append(parts, fmt.Sprintf("%s=%d", k, v))
		}
		sort.Strings(parts)
		sc.note("errors surfaced: %s", strings.Join(parts, " "))
	}
	if len(undecided) > 0 {
		sc.note("%d failed sends never reached a broker (no half message, no txlog row)", len(undecided))
	}
	sc.note("converged in %s; dead letters %d; orders/txlog/outbox mismatches %d", time.Since(start).Round(100*time.Millisecond), parked, inconsistent)

	for id, why := range lost {
		t.Errorf("LOST %s: %s", id, why)
	}
	for id, why := range ghosts {
		t.Errorf("GHOST %s: %s; first delivery: %s", id, why, testenv.Describe(b.coll.Message(id)))
	}
	require.Zero(t, sc.Lost, "lost")
	require.Zero(t, sc.Ghosts, "ghosts")
	require.Zero(t, sc.Double, "double effects")
	require.Zero(t, inconsistent, "the business rows match the txlog and outbox rows")
	require.Zero(t, parked, "dead letters")
	require.Positive(t, sc.Committed)
	t.Logf("%s: attempted=%d committed=%d rolled_back=%d consumed=%d lost=%d ghosts=%d dup_absorbed=%d dup_delivered=%d double=%d recover=%s",
		sc.Name, sc.Attempted, sc.Committed, sc.RolledBack, sc.Consumed, sc.Lost, sc.Ghosts, sc.DupAbsorb, sc.DupDeliver, sc.Double, sc.Recover)
}

// orderViolations lists the aggregates whose effects were not applied in
// strictly increasing version order (effects ids are the order of commit).
func (b *bed) orderViolations(t *testing.T) []string {
	t.Helper()
	var rows []struct {
		Agg string `db:"agg"`
		Ver int64  `db:"ver"`
	}
	require.NoError(t, b.db.Select(&rows, "SELECT agg, ver FROM effects WHERE agg <> '' ORDER BY id"))
	last := map[string]int64{}
	var out []string
	for _, r := range rows {
		if r.Ver <= last[r.Agg] {
			out = append(out, fmt.Sprintf("%s: version %d after %d", r.Agg, r.Ver, last[r.Agg]))
		}
		last[r.Agg] = r.Ver
	}
	return out
}

// ---------- brokers ----------

// lookup asks both brokers' indexes: the operator's view (package inspect),
// which the cluster tests use to tell which broker holds an event.
func lookup() inspect.RemotingLookup {
	return inspect.RemotingLookup{NameServers: []string{testenv.Load().NameServer}, Timeout: 5 * time.Second}
}

// brokersHolding returns the names of the brokers whose index holds id in
// topic (the half topic, the discard topic, or an ordinary topic).
func brokersHolding(ctx context.Context, topic, id string) (map[string]bool, error) {
	ms, err := lookup().QueryByKey(ctx, topic, id, 32)
	out := map[string]bool{}
	for _, m := range ms {
		out[brokerName(m.Broker)] = true
	}
	return out, err
}

// answeredBy returns the check answers recorded for id.
func (b *bed) answeredBy(id string) []answer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]answer(nil), b.answers[id]...)
}

// waitFor polls cond until it holds or timeout passes (a bounded condition
// wait, never a fixed sleep).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
