//go:build failpoints

package faultsuite

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
	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

const (
	// fenceAge fits the private broker (transactionTimeOut 3 s, check
	// interval 2 s, max 5 checks); see the checkback package doc.
	fenceAge  = 4 * time.Second
	eventType = "OrderPlaced"
	queues    = 4
)

var errBusiness = errors.New("faultsuite: business rule says no")

// bed is one scenario's world: a fresh database holding the producer's txlog,
// the outbox, the consumer tables and two business tables, one topic, one
// producer group and one consumer group. orders is written by every local
// transaction (the producer's truth besides the txlog); effects is written by
// the consumer's handler and has no unique key, so a double effect shows.
type bed struct {
	t      *testing.T
	s      testenv.Settings
	db     *sqlx.DB
	dbName string
	topic  string
	pgroup string
	cgroup string
	store  *txlog.Store
	obx    outbox.Table
	coll   *testenv.Collector
	sc     *scenario
	start  time.Time

	mu        sync.Mutex
	attempts  map[string]*attempt
	commitAns map[string]int // event id -> COMMIT check answers seen by parent producers
	consumers []*consumer.Consumer
	procs     []*consumer.Processor
	sendErrs  map[string]int  // error class -> count
	published map[string]bool // events published without a txlog or outbox row (storms): committed by definition
	direct    map[string]bool // events processed without the broker: the collector never sees them
	parked    int             // dead letters the scenario expects (payload conflicts)
}

// attempt is one transaction the test started.
type attempt struct {
	id       string
	source   string // "tx", "outbox" or "crash:<failpoint>"
	rollback bool   // the business function rolls back on purpose
	state    txproducer.State
	err      error
	answered bool // Send (or the outbox commit) returned
}

func newBed(t *testing.T, name string) *bed {
	t.Helper()
	s := testenv.Integration(t)
	db := testenv.DB(t)
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	ctx := context.Background()
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, consumer.Migrate(ctx, db, ""))
	obx, err := outbox.NewTable("")
	require.NoError(t, err)
	require.NoError(t, obx.Migrate(ctx, db))
	for _, q := range []string{
		`CREATE TABLE orders (event_id VARCHAR(64) NOT NULL PRIMARY KEY, source VARCHAR(16) NOT NULL)`,
		`CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL, consumer VARCHAR(64) NOT NULL, KEY (event_id))`,
	} {
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	b := &bed{
		t: t, s: s, db: db, dbName: testenv.DBName(t, db), store: store, obx: obx,
		topic: testenv.Name(t, "topic"), pgroup: testenv.Name(t, "pg"), cgroup: testenv.Name(t, "cg"),
		sc: &scenario{Name: name}, start: time.Now(),
		attempts: map[string]*attempt{}, commitAns: map[string]int{}, sendErrs: map[string]int{},
		published: map[string]bool{}, direct: map[string]bool{},
	}
	testenv.CreateTopic(t, b.topic, queues)
	b.coll = testenv.Collect(t, b.topic)
	t.Cleanup(func() {
		b.sc.Duration = time.Since(b.start)
		report.add(b.sc)
	})
	return b
}

// ---------- producers ----------

func (b *bed) producerConfig() txproducer.Config {
	return txproducer.Config{
		NameServers:        []string{b.s.NameServer},
		Group:              b.pgroup,
		DB:                 b.db,
		FenceAge:           fenceAge,
		CheckTimeout:       10 * time.Second,
		WarmupTopics:       []string{b.topic},
		RecoveryStartRetry: time.Second,
		OnCheck: func(a checkback.Answer) {
			if a.Decision == checkback.Commit {
				b.mu.Lock()
				b.commitAns[a.EventID]++
				b.mu.Unlock()
			}
		},
	}
}

func (b *bed) startProducer(t *testing.T) *txproducer.Producer {
	t.Helper()
	p, err := txproducer.New(b.producerConfig())
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

func (b *bed) message(id string) txproducer.Message {
	return txproducer.Message{Topic: b.topic, EventID: id, EventType: eventType, BusinessKey: "order-" + id[len(id)-8:],
		Headers: map[string]string{"suite": "faultsuite"}, Payload: payload(id)}
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
		{"ErrLocalTx", txproducer.ErrLocalTx}, {"ErrSend", txproducer.ErrSend}, {"ErrDatabase", txproducer.ErrDatabase},
		{"ErrCommitUnknown", txproducer.ErrCommitUnknown}, {"ErrFenced", txproducer.ErrFenced}, {"ErrClosed", txproducer.ErrClosed},
	} {
		if errors.Is(err, c.err) {
			return c.name, true
		}
	}
	return "untyped", false
}

// sendTx runs one transactional Send and records it. It returns the error.
func (b *bed) sendTx(ctx context.Context, p *txproducer.Producer, rollback bool) error {
	id := envelope.NewEventID()
	a := &attempt{id: id, source: "tx", rollback: rollback}
	b.record(a)
	res, err := p.Send(ctx, b.message(id), insertOrder(id, "tx", rollback))
	b.mu.Lock()
	a.state, a.err, a.answered = res.State, err, true
	if err != nil && !(rollback && errors.Is(err, txproducer.ErrLocalTx)) {
		name, _ := classify(err)
		b.sendErrs[name]++
	}
	b.mu.Unlock()
	return err
}

// enqueueOutbox writes an order and its outbox row in one business
// transaction and records it.
func (b *bed) enqueueOutbox(ctx context.Context, rollback bool, d *outbox.Dispatcher) error {
	id := envelope.NewEventID()
	a := &attempt{id: id, source: "outbox", rollback: rollback}
	b.record(a)
	err := func() error {
		tx, err := b.db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, "INSERT INTO orders (event_id, source) VALUES (?, ?)", id, "outbox"); err != nil {
			return err
		}
		if _, err := b.obx.Enqueue(ctx, tx, outbox.Event{EventID: id, EventType: eventType, Destination: b.topic,
			MessageKey: "order-" + id[len(id)-8:], Payload: payload(id), Headers: map[string]string{"suite": "faultsuite"}}); err != nil {
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
		_, err := tx.ExecContext(ctx, "INSERT INTO effects (event_id, consumer) VALUES (?, ?)", ev.ID, name)
		return err
	}
}

func consumerConfig(db *sqlx.DB, nameServer, topic, group, name string) consumer.Config {
	return consumer.Config{
		ProcessorConfig: consumer.ProcessorConfig{
			Group: group, DB: db,
			Routes:     map[string]consumer.Route{eventType: {Handler: handler(name)}},
			MaxRetries: 200, // outages are long; the bound is not what is tested here
			DelayLevel: func(consumer.Class, int) int { return 1 },
		},
		NameServers: []string{nameServer},
		Topic:       topic,
	}
}

func (b *bed) startConsumer(t *testing.T, name string) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(consumerConfig(b.db, b.s.NameServer, b.topic, b.cgroup, name))
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Shutdown(ctx)
	})
	b.mu.Lock()
	b.consumers = append(b.consumers, c)
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

// load runs transactional Sends (and every outboxEvery-th an outbox enqueue)
// on several goroutines until stop says so. One attempt in five rolls back on
// purpose. After an error a worker waits a second, so an outage is a series of
// clear errors rather than a busy loop.
type load struct {
	b         *bed
	producers []*txproducer.Producer
	disp      *outbox.Dispatcher
	every     int           // an outbox enqueue every N attempts (0: none)
	limiter   *rate.Limiter // nil: as fast as the workers go
	n         atomic.Int64
	ok        atomic.Int64 // Sends that returned committed
	errs      atomic.Int64
	wg        sync.WaitGroup
	cancel    context.CancelFunc
}

func (b *bed) startLoad(producers []*txproducer.Producer, disp *outbox.Dispatcher, every int, workers int, lim *rate.Limiter, stop func(l *load) bool) *load {
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{b: b, producers: producers, disp: disp, every: every, limiter: lim, cancel: cancel}
	for w := 0; w < workers; w++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil && !stop(l) {
				if lim := l.limiter; lim != nil {
					if lim.Wait(ctx) != nil {
						return
					}
				}
				i := l.n.Add(1)
				rollback := i%5 == 0
				var err error
				sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
				if l.every > 0 && i%int64(l.every) == 1 {
					err = b.enqueueOutbox(sctx, rollback, l.disp)
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
					case <-time.After(time.Second):
					}
				}
			}
		}()
	}
	return l
}

// stopAndWait stops the workers and waits for the Sends in flight.
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
	b.mu.Lock()
	for id := range b.published {
		tr.committed[id] = true
	}
	b.mu.Unlock()
	if err := read("SELECT event_id AS k, CAST(COUNT(*) AS CHAR) AS v FROM effects GROUP BY event_id", func(r kv) {
		var n int
		_, _ = fmt.Sscan(r.V, &n)
		tr.effects[r.K] = n
	}); err != nil {
		return tr, err
	}
	return tr, nil
}

func (b *bed) isDirect(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.direct[id]
}

// pending are the ids a converged system still owes: committed but not
// applied or not seen by the collector, and outbox rows not yet SENT.
func (b *bed) pending(tr truth, snap testenv.Snapshot) []string {
	var out []string
	for id := range tr.committed {
		if tr.effects[id] == 0 || (snap.Counts[id] == 0 && !b.isDirect(id)) {
			out = append(out, id)
		} else if st, ok := tr.outboxSt[id]; ok && st != string(outbox.StatusSent) && st != string(outbox.StatusDead) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// verify waits until the system has converged (bounded by timeout), then
// compares the database's truth with the consumers' view, records the
// figures in the scenario and asserts lost = ghosts = double effects = 0.
// settle lists event ids whose half message may still be unresolved at the
// broker (their Send failed ambiguously): verify waits, bounded, until each
// has a txlog row, so that a ghost would have had its chance to appear.
func (b *bed) verify(t *testing.T, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()

	// 1. Settle: ambiguous sends get a decision or provably none.
	b.mu.Lock()
	var ambiguous []string
	for id, a := range b.attempts {
		if a.source == "tx" && a.err != nil && !(a.rollback && errors.Is(a.err, txproducer.ErrLocalTx)) {
			ambiguous = append(ambiguous, id)
		}
	}
	b.mu.Unlock()
	settleBy := time.Now().Add(fenceAge + 20*time.Second)
	undecided := len(ambiguous)
	for undecided > 0 && time.Now().Before(settleBy) {
		tr, err := b.readTruth(ctx)
		if err == nil {
			undecided = 0
			for _, id := range ambiguous {
				if !tr.committed[id] && !tr.rolled[id] {
					undecided++
				}
			}
		}
		if undecided > 0 {
			time.Sleep(250 * time.Millisecond)
		}
	}

	// 2. Converge: every committed event applied and collected.
	deadline := time.Now().Add(timeout)
	var tr truth
	var snap testenv.Snapshot
	for {
		var err error
		tr, err = b.readTruth(ctx)
		snap = b.coll.Snapshot()
		if err == nil && len(b.pending(tr, snap)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			if err != nil {
				t.Errorf("reading the truth: %v", err)
			}
			break
		}
		time.Sleep(250 * time.Millisecond)
	}

	// 3. Compare.
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
		} else if snap.Counts[id] == 0 && !b.direct[id] {
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
	for id := range b.commitAns {
		if !tr.committed[id] {
			ghosts[id] = "check answered COMMIT without a committed row"
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
		st := p.Stats()
		sc.DupAbsorb += int(st.Duplicates)
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
	if undecided > 0 {
		sc.note("%d failed sends never reached the broker (no half message, no txlog row)", undecided)
	}
	sc.note("converged in %s; dead letters %d; orders/txlog/outbox mismatches %d", time.Since(start).Round(100*time.Millisecond), parked, inconsistent)

	for id, why := range lost {
		t.Errorf("LOST %s: %s", id, why)
	}
	for id, why := range ghosts {
		t.Errorf("GHOST %s: %s; first delivery: %s", id, why, testenv.Describe(b.coll.Message(id)))
	}
	if parked != b.parked {
		type dl struct {
			Topic   string `db:"topic"`
			Queue   int    `db:"queue_id"`
			Offset  int64  `db:"queue_offset"`
			MsgID   string `db:"msg_id"`
			EventID string `db:"event_id"`
			Class   string `db:"error_class"`
			Text    string `db:"error_text"`
		}
		var rows []dl
		if err := b.db.SelectContext(ctx, &rows, "SELECT topic, queue_id, queue_offset, msg_id, event_id, error_class, error_text FROM rmqtx_dead_letter ORDER BY id"); err == nil {
			for _, r := range rows {
				t.Logf("dead letter: topic=%s queue=%d offset=%d msgId=%s event=%q class=%s: %s", r.Topic, r.Queue, r.Offset, r.MsgID, r.EventID, r.Class, r.Text)
			}
		}
	}
	require.Zero(t, sc.Lost, "lost")
	require.Zero(t, sc.Ghosts, "ghosts")
	require.Zero(t, sc.Double, "double effects")
	require.Zero(t, inconsistent, "the business rows match the txlog and outbox rows")
	require.Equal(t, b.parked, parked, "dead letters (only the expected payload conflicts)")
	require.Positive(t, sc.Committed)
	t.Logf("%s: attempted=%d committed=%d rolled_back=%d consumed=%d lost=%d ghosts=%d dup_absorbed=%d dup_delivered=%d double=%d",
		sc.Name, sc.Attempted, sc.Committed, sc.RolledBack, sc.Consumed, sc.Lost, sc.Ghosts, sc.DupAbsorb, sc.DupDeliver, sc.Double)
}
