package testbed

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

const (
	// FenceAge fits the private brokers (transactionTimeOut 3 s, check
	// interval 2 s, max 5 checks, the same on every broker): FenceAge +
	// interval < timeout + (max-1) x interval, 4 + 2 < 3 + 8. See the
	// checkback package doc.
	FenceAge = 4 * time.Second
	// EventType is the type of every event of the bed.
	EventType = "OrderPlaced"
)

// ErrBusiness is the business function's own refusal (a rollback on purpose).
var ErrBusiness = errors.New("testbed: business rule says no")

// Bed is one scenario's world: a fresh database holding the producer's
// txlog, the outbox, the consumer tables and two business tables, one topic
// with queues on every broker, one producer group and one consumer group.
// orders is written by every local transaction (the producer's truth
// besides the txlog); effects is written by the consumers' handler and has
// no unique key, so a double effect shows.
type Bed struct {
	Suite  *Suite
	S      testenv.Settings
	DB     *sqlx.DB
	DBName string
	// Kind is the bed's database server (testenv.DBMySQL or
	// testenv.DBPostgres), and DBRef names its database on that server for a
	// crash child (testenv.OpenDBRef).
	Kind    string
	DBRef   string
	Topic   string
	PGroup  string
	CGroup  string
	Route   []remoting.RouteBroker // the topic's queues, per broker
	Store   *txlog.Store
	Obx     outbox.Table
	Coll    *testenv.Collector // an independent raw consumer of Topic
	Sc      *Scenario
	Started time.Time

	mu        sync.Mutex
	attempts  map[string]*Attempt
	answers   map[string][]Answer // event id -> check answers, in order
	recovered map[string][]discard.Result
	consumers []*consumer.Consumer
	procs     []*consumer.Processor
	sendErrs  map[string]int  // error class -> count
	published map[string]bool // events published without a txlog or outbox row (storms): committed by definition
	direct    map[string]bool // events processed without the broker: the collector never sees them
	parked    int             // dead letters the scenario expects (payload conflicts)
}

// Attempt is one transaction the test started.
type Attempt struct {
	ID       string
	Source   string // "tx", "outbox", "marker", "crash:<failpoint>" (a child killed there), or the test's own
	Broker   string // crash attempts: the broker that stored the half, when known
	Rollback bool   // the business function rolls back on purpose
	State    txproducer.State
	Err      error
	Answered bool // Send (or the outbox commit) returned
}

// Answer is one check answer given by a producer of the bed.
type Answer struct {
	Producer string
	Decision checkback.Decision
	At       time.Time
}

// NewBed builds a scenario's world on the database testenv.DB picks
// (MariaDB, or PostgreSQL with RMQTX_TEST_DB=postgres); its figures join
// the suite's summary when t ends, verified or not.
func (s *Suite) NewBed(t *testing.T, name string) *Bed {
	t.Helper()
	return s.NewBedOn(t, name, "")
}

// NewBedOn is NewBed on the database server kind (testenv.DBMySQL or
// testenv.DBPostgres; "" picks as NewBed does). The scenario's figures are
// reported under that database, so one test body run on both shows both.
func (s *Suite) NewBedOn(t *testing.T, name, kind string) *Bed {
	t.Helper()
	testenv.Integration(t)
	require.NotNil(t, s.private, "the suite's tests need its private services (started by TestMain)")
	var db *sqlx.DB
	switch kind {
	case "":
		db = testenv.DB(t)
	case testenv.DBMySQL:
		db = testenv.MySQLDB(t)
	case testenv.DBPostgres:
		db = testenv.PostgresDB(t)
	default:
		t.Fatalf("testbed: unknown database %q", kind)
	}
	return s.NewBedDB(t, name, db)
}

// NewBedDB is NewBed on db, a fresh database of testenv's (MySQLDB,
// PostgresDB, or the one testenv.EachDB passes), for a suite whose
// scenarios run on each database in turn rather than in parallel.
func (s *Suite) NewBedDB(t *testing.T, name string, db *sqlx.DB) *Bed {
	t.Helper()
	env := testenv.Integration(t)
	require.NotNil(t, s.private, "the suite's tests need its private services (started by TestMain)")
	db.SetMaxOpenConns(s.cfg.DBConns)
	db.SetMaxIdleConns(s.cfg.DBConns)
	ref := testenv.DBRef(t, db)
	kind, _, _ := strings.Cut(ref, "/")
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	obx, err := outbox.NewTable("")
	require.NoError(t, err)
	for _, q := range businessTables[kind] {
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	b := &Bed{
		Suite: s, S: env, DB: db, DBName: testenv.DBName(t, db), Kind: kind, DBRef: ref, Store: store, Obx: obx,
		Topic: testenv.Name(t, "topic"), PGroup: testenv.Name(t, "pg"), CGroup: testenv.Name(t, "cg"),
		Sc: &Scenario{Name: name, DB: kind}, Started: time.Now(),
		attempts: map[string]*Attempt{}, answers: map[string][]Answer{}, recovered: map[string][]discard.Result{},
		sendErrs: map[string]int{}, published: map[string]bool{}, direct: map[string]bool{},
	}
	b.Route = testenv.CreateClusterTopic(t, b.Topic, s.cfg.QueuesPerBroker)
	require.Len(t, b.Route, s.routedBrokers(), "the topic has queues on every broker: %v", b.Route)
	b.Coll = testenv.Collect(t, b.Topic)
	t.Cleanup(func() {
		b.Sc.Duration = time.Since(b.Started)
		s.Report.Add(b.Sc)
	})
	return b
}

// businessTables are the bed's two business tables, per database server:
// orders (the producer's truth besides the txlog) and effects (no unique
// key on event_id, so a double effect shows).
var businessTables = map[string][]string{
	testenv.DBMySQL: {
		`CREATE TABLE orders (event_id VARCHAR(64) NOT NULL PRIMARY KEY, source VARCHAR(32) NOT NULL)`,
		`CREATE TABLE effects (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL, consumer VARCHAR(64) NOT NULL,
			agg VARCHAR(64) NOT NULL DEFAULT '', ver BIGINT NOT NULL DEFAULT 0, KEY (event_id))`,
	},
	testenv.DBPostgres: {
		`CREATE TABLE orders (event_id VARCHAR(64) NOT NULL PRIMARY KEY, source VARCHAR(32) NOT NULL)`,
		`CREATE TABLE effects (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, event_id VARCHAR(64) NOT NULL, consumer VARCHAR(64) NOT NULL,
			agg VARCHAR(64) NOT NULL DEFAULT '', ver BIGINT NOT NULL DEFAULT 0)`,
		`CREATE INDEX effects_event_id ON effects (event_id)`,
	},
}

// ---------- producers ----------

// ProducerConfig is the config of a producer instance of the bed's group;
// label names it in the recorded check answers.
func (b *Bed) ProducerConfig(label string) txproducer.Config {
	return txproducer.Config{
		NameServers:        []string{b.S.NameServer},
		Group:              b.PGroup,
		DB:                 b.DB,
		FenceAge:           FenceAge,
		CheckTimeout:       10 * time.Second,
		WarmupTopics:       []string{b.Topic},
		RecoveryStartRetry: time.Second,
		OnCheck: func(a checkback.Answer) {
			b.mu.Lock()
			b.answers[a.EventID] = append(b.answers[a.EventID], Answer{Producer: label, Decision: a.Decision, At: time.Now()})
			b.mu.Unlock()
		},
		OnRecovery: b.onRecovery,
	}
}

func (b *Bed) onRecovery(r discard.Result) {
	if r.EventID == "" {
		return
	}
	b.mu.Lock()
	b.recovered[r.EventID] = append(b.recovered[r.EventID], r)
	b.mu.Unlock()
}

// StartProducer starts a producer instance of the bed's group (mod, when
// set, changes its config) and shuts it down when t ends.
func (b *Bed) StartProducer(t *testing.T, label string, mod func(*txproducer.Config)) *txproducer.Producer {
	t.Helper()
	cfg := b.ProducerConfig(label)
	if mod != nil {
		mod(&cfg)
	}
	return StartProducer(t, cfg)
}

// StartProducer starts a producer with cfg (Start bounded by 60 s) and
// shuts it down when t ends.
func StartProducer(t *testing.T, cfg txproducer.Config) *txproducer.Producer {
	t.Helper()
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

// InsertOrder is the business part of every local transaction.
func InsertOrder(id, source string, rollback bool) txproducer.LocalTxFunc {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (event_id, source) VALUES (?, ?)"), id, source); err != nil {
			return err
		}
		if rollback {
			return ErrBusiness
		}
		return nil
	}
}

// Payload is the body of event id.
func Payload(id string) []byte { return []byte(`{"order":"` + id + `","amount":42}`) }

// Message is event id on topic, as suite (a header) sends it.
func Message(suite, topic, id string) txproducer.Message {
	return txproducer.Message{Topic: topic, EventID: id, EventType: EventType, BusinessKey: "order-" + id[len(id)-8:],
		Headers: map[string]string{"suite": suite}, Payload: Payload(id)}
}

// Message is event id on the bed's topic.
func (b *Bed) Message(id string) txproducer.Message { return Message(b.Suite.cfg.Name, b.Topic, id) }

// Record adds an attempt.
func (b *Bed) Record(a *Attempt) {
	b.mu.Lock()
	b.attempts[a.ID] = a
	b.mu.Unlock()
}

// Answered records the outcome of a recorded attempt.
func (b *Bed) Answered(a *Attempt, state txproducer.State, err error) {
	b.mu.Lock()
	a.State, a.Err, a.Answered = state, err, true
	b.mu.Unlock()
}

// AttemptIDs returns the ids of the attempts of source ("tx", "outbox", ...).
func (b *Bed) AttemptIDs(source string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id, a := range b.attempts {
		if a.Source == source {
			out = append(out, id)
		}
	}
	return out
}

// Attempt returns a copy of the attempt of id.
func (b *Bed) Attempt(id string) (Attempt, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.attempts[id]
	if !ok {
		return Attempt{}, false
	}
	return *a, true
}

// Attempts returns a copy of every attempt, in no order.
func (b *Bed) Attempts() []Attempt {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Attempt, 0, len(b.attempts))
	for _, a := range b.attempts {
		out = append(out, *a)
	}
	return out
}

// Classify names the class of a Send error and reports whether it is one of
// the library's typed errors.
func Classify(err error) (string, bool) {
	for _, c := range []struct {
		name string
		err  error
	}{
		{"ErrLocalTx", txproducer.ErrLocalTx}, {"ErrForcedRollback", txproducer.ErrForcedRollback}, {"ErrSend", txproducer.ErrSend}, {"ErrDatabase", txproducer.ErrDatabase},
		{"ErrCommitUnknown", txproducer.ErrCommitUnknown}, {"ErrFenced", txproducer.ErrFenced}, {"ErrClosed", txproducer.ErrClosed},
		{"ErrEventIDConflict", txproducer.ErrEventIDConflict},
	} {
		if errors.Is(err, c.err) {
			return c.name, true
		}
	}
	return "untyped", false
}

// SendTx runs one transactional Send and records it.
func (b *Bed) SendTx(ctx context.Context, p *txproducer.Producer, rollback bool) error {
	_, err := b.SendTxID(ctx, p, rollback)
	return err
}

// SendTxID is SendTx, returning the event id too.
func (b *Bed) SendTxID(ctx context.Context, p *txproducer.Producer, rollback bool) (string, error) {
	return b.sendAs(ctx, p, "tx", rollback)
}

func (b *Bed) sendAs(ctx context.Context, p *txproducer.Producer, source string, rollback bool) (string, error) {
	id := wire.NewEventID()
	a := &Attempt{ID: id, Source: source, Rollback: rollback}
	b.Record(a)
	m := b.Message(id)
	if source == "marker" {
		// No routing key: the client's round robin puts one marker in
		// every queue (Quiet), where a key would pick its queue by hash.
		m.BusinessKey = ""
	}
	res, err := p.Send(ctx, m, InsertOrder(id, source, rollback))
	b.mu.Lock()
	a.State, a.Err, a.Answered = res.State, err, true
	if err != nil && !(rollback && errors.Is(err, txproducer.ErrLocalTx)) {
		name, _ := Classify(err)
		b.sendErrs[name]++
	}
	b.mu.Unlock()
	return id, err
}

// SendErrs returns the Send errors seen so far, per class ("untyped" for
// one that is none of txproducer's).
func (b *Bed) SendErrs() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make(map[string]int, len(b.sendErrs))
	for k, v := range b.sendErrs {
		out[k] = v
	}
	return out
}

// OutboxEvent is one outbox row's event (a new id when id is ""); agg, when
// set, pins it to a queue through the sink's sharding key.
func (b *Bed) OutboxEvent(id, agg string, version int64) outbox.Event {
	if id == "" {
		id = wire.NewEventID()
	}
	e := outbox.Event{EventID: id, EventType: EventType, Destination: b.Topic,
		MessageKey: "order-" + id[len(id)-8:], Payload: Payload(id), Headers: map[string]string{"suite": b.Suite.cfg.Name}}
	if agg != "" {
		e.AggregateType, e.AggregateID, e.AggregateVersion = "Order", agg, version
	}
	return e
}

// EnqueueOutbox writes an order and its outbox row in one business
// transaction, records it, and notifies d (when set) after the commit.
func (b *Bed) EnqueueOutbox(ctx context.Context, e outbox.Event, rollback bool, d *outbox.Dispatcher) error {
	if e.EventID == "" {
		e.EventID = wire.NewEventID()
	}
	a := &Attempt{ID: e.EventID, Source: "outbox", Rollback: rollback}
	b.Record(a)
	err := func() error {
		tx, err := b.DB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (event_id, source) VALUES (?, ?)"), e.EventID, "outbox"); err != nil {
			return err
		}
		if _, err := b.Obx.Enqueue(ctx, tx, e); err != nil {
			return err
		}
		if rollback {
			return ErrBusiness
		}
		return tx.Commit()
	}()
	b.mu.Lock()
	a.Err, a.Answered = err, true
	if err != nil && !errors.Is(err, ErrBusiness) {
		b.sendErrs["outbox enqueue (database)"]++
	}
	b.mu.Unlock()
	if err == nil && d != nil {
		d.Notify()
	}
	return err
}

// Publish marks ids as events the test publishes itself, without a txlog
// or outbox row (storms): committed by definition, and sent more than once
// on purpose (so not counted in stored>1).
func (b *Bed) Publish(ids ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, id := range ids {
		b.published[id] = true
	}
}

// Direct marks id as processed without the broker: the collector never
// sees it.
func (b *Bed) Direct(id string) {
	b.mu.Lock()
	b.direct[id] = true
	b.mu.Unlock()
}

// ExpectParked sets how many dead letters the scenario expects.
func (b *Bed) ExpectParked(n int) {
	b.mu.Lock()
	b.parked = n
	b.mu.Unlock()
}

// Answers returns the check answers recorded for id.
func (b *Bed) Answers(id string) []Answer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Answer(nil), b.answers[id]...)
}

// FirstAnswerAfter returns the time of the first check answered after at,
// for any event of the bed, and whether there was one.
func (b *Bed) FirstAnswerAfter(at time.Time) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var first time.Time
	for _, as := range b.answers {
		for _, a := range as {
			if a.At.After(at) && (first.IsZero() || a.At.Before(first)) {
				first = a.At
			}
		}
	}
	return first, !first.IsZero()
}

// Recovered returns the discard recovery results recorded for id.
func (b *Bed) Recovered(id string) []discard.Result {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]discard.Result(nil), b.recovered[id]...)
}

// CommitAnswers counts the COMMIT answers to checks given at or after
// since, and the distinct events they were for.
func (b *Bed) CommitAnswers(since time.Time) (answers, events int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, as := range b.answers {
		n := 0
		for _, a := range as {
			if a.Decision == checkback.Commit && !a.At.Before(since) {
				n++
			}
		}
		answers += n
		if n > 0 {
			events++
		}
	}
	return answers, events
}

// RecoveryDecisions counts discard recovery's decisions, per decision
// (txlog.RecoveryRepublished, ...), over every event of the bed.
func (b *Bed) RecoveryDecisions() map[txlog.RecoveryDecision]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[txlog.RecoveryDecision]int{}
	for _, rs := range b.recovered {
		for _, r := range rs {
			if r.Decision != "" {
				out[r.Decision]++
			}
		}
	}
	return out
}

// RecoveredIDs is the number of event ids discard recovery reported on.
func (b *Bed) RecoveredIDs() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.recovered)
}

// ---------- consumers and dispatchers ----------

// CreateEffects creates table, shaped like effects (no unique key on
// event_id, so a double effect shows), for a consumer group of its own that
// the bed's verification does not count: the scenario counts it itself.
func (b *Bed) CreateEffects(t *testing.T, table string) {
	t.Helper()
	require.NoError(t, sqlname.ValidatePrefix(table), "table name %q", table)
	for _, q := range businessTables[b.Kind][1:] {
		_, err := b.DB.Exec(strings.ReplaceAll(q, "effects", table))
		require.NoError(t, err)
	}
}

// BatchTxs counts the transactions a handler ran in and how many events
// each held: in batch mode (consumer.Config.BatchTransaction) the events of
// one delivered batch share one transaction, so a transaction with more
// than one event is a batch the database committed whole.
type BatchTxs struct {
	mu     sync.Mutex
	events map[*sqlx.Tx]int
}

// Wrap returns h counting its calls per transaction.
func (c *BatchTxs) Wrap(h consumer.Handler) consumer.Handler {
	return func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		c.mu.Lock()
		if c.events == nil {
			c.events = map[*sqlx.Tx]int{}
		}
		c.events[tx]++
		c.mu.Unlock()
		return h(ctx, tx, ev)
	}
}

// Multi returns the number of transactions that held more than one event,
// and the most events one held.
func (c *BatchTxs) Multi() (txs, most int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.events {
		if n > 1 {
			txs++
		}
		most = max(most, n)
	}
	return txs, most
}

// Handler applies the business effect: one effects row per run.
func Handler(name string) consumer.Handler {
	return func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO effects (event_id, consumer, agg, ver) VALUES (?, ?, ?, ?)"),
			ev.ID, name, ev.AggregateID, ev.AggregateVersion)
		return err
	}
}

// ConsumerConfig is the config of a consumer instance name of group.
func ConsumerConfig(db *sqlx.DB, nameServer, topic, group, name string) consumer.Config {
	return consumer.Config{
		Group: group, DB: db,
		Routes:      map[string]consumer.Route{EventType: {Handler: Handler(name)}},
		MaxRetries:  200, // outages are long; the bound is not what is tested here
		DelayLevel:  func(consumer.Class, int) int { return 1 },
		NameServers: []string{nameServer},
		Topic:       topic,
	}
}

// StartConsumer starts a consumer instance of the bed's group and shuts it
// down when t ends.
func (b *Bed) StartConsumer(t *testing.T, name string) *consumer.Consumer {
	t.Helper()
	return b.StartConsumerWith(t, name, nil)
}

// StartConsumerWith is StartConsumer with mod, when set, changing the
// instance's config (batch mode, say); its figures count as the group's.
func (b *Bed) StartConsumerWith(t *testing.T, name string, mod func(*consumer.Config)) *consumer.Consumer {
	t.Helper()
	cfg := ConsumerConfig(b.DB, b.S.NameServer, b.Topic, b.CGroup, name)
	if mod != nil {
		mod(&cfg)
	}
	c, err := consumer.New(cfg)
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

// Consumers returns the consumers started by StartConsumer.
func (b *Bed) Consumers() []*consumer.Consumer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]*consumer.Consumer(nil), b.consumers...)
}

// AddProcessors counts the dedup hits of processors the test runs itself.
func (b *Bed) AddProcessors(ps ...*consumer.Processor) {
	b.mu.Lock()
	b.procs = append(b.procs, ps...)
	b.mu.Unlock()
}

// StartDispatcher starts an outbox dispatcher on the bed's database with a
// RocketMQ sink of its own (backoff defaults for long outages), shut down
// when t ends.
func (b *Bed) StartDispatcher(t *testing.T, cfg outbox.Config) *outbox.Dispatcher {
	t.Helper()
	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{b.S.NameServer}, Group: b.PGroup + "_obx"})
	require.NoError(t, err)
	cfg.DB, cfg.Sink = b.DB, sink
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
