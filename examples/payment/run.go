package main

import (
	"context"
	_ "embed"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// Table prefixes of the three outboxes and the rmqtx tables.
const (
	payOutboxPrefix   = "pay_" // payment service: OrderPaid
	orderOutboxPrefix = "ord_" // order service: OrderCreated, OrderCanceled
	smsOutboxPrefix   = "sms_" // notification consumer: SendSMS commands
	rmqtxPrefix       = "rmqtx_"
)

// Names are the broker names of one run. Every run gets its own, so a
// second run never sees the first one's messages or offsets.
type Names struct {
	PaymentTopic, OrderTopic                    string
	ProducerGroup, OutboxGroup                  string
	PointsGroup, NotificationGroup, SearchGroup string
}

// NamesFor derives the names from a run id.
func NamesFor(runID string) Names {
	p := "rmqtx_demo_" + runID + "_"
	return Names{
		PaymentTopic: p + "payment", OrderTopic: p + "order",
		ProducerGroup: p + "pay_tx", OutboxGroup: p + "outbox",
		PointsGroup: p + "points", NotificationGroup: p + "notification", SearchGroup: p + "search",
	}
}

// Groups lists the consumer groups.
func (n Names) Groups() []string { return []string{n.PointsGroup, n.NotificationGroup, n.SearchGroup} }

// ReconcileTables are the rmqtx tables the reconciliation reads.
func ReconcileTables(groups []string) Tables {
	return Tables{
		Txlog: rmqtxPrefix + "txlog", DeadLetter: rmqtxPrefix + "dead_letter",
		Outboxes: []string{payOutboxPrefix + "outbox", orderOutboxPrefix + "outbox", smsOutboxPrefix + "outbox"},
		Groups:   groups,
	}
}

// RunConfig configures one demo run.
type RunConfig struct {
	DB          *sqlx.DB
	NameServers []string
	Broker      string // broker address, for creating the run's topics
	RunID       string
	Secret      []byte

	Payments      int     // payments made and paid (default 200)
	Users         int     // distinct users (default Payments/8, at least 3)
	DupRate       float64 // share of payments whose callback is repeated
	FailRate      float64 // share of events whose first consume attempt fails, per group
	CancelRate    float64 // extra orders, as a share of Payments, canceled unpaid
	RedeliverRate float64 // share of PaymentSucceeded events delivered a second time
	LostSMSRate   float64 // share of SMS whose gateway response is lost
	Concurrency   int     // callback workers (default 8)
	NoRestart     bool    // skip the producer restart
	SMSEvery      time.Duration
	SMSBurst      int
	FenceAge      time.Duration

	Log      logrus.FieldLogger // the demo's own log
	LibLog   logrus.FieldLogger // rmqtx's logs (warnings)
	Progress time.Duration      // progress line interval (default 2s)
	Timeout  time.Duration      // bound on waiting for quiescence (default 3m)
}

func (c *RunConfig) defaults() {
	if c.Payments <= 0 {
		c.Payments = 200
	}
	if c.Users <= 0 {
		c.Users = max(3, c.Payments/8)
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 8
	}
	if c.SMSEvery <= 0 {
		c.SMSEvery = 300 * time.Millisecond
	}
	if c.SMSBurst <= 0 {
		c.SMSBurst = 2
	}
	if c.FenceAge <= 0 {
		c.FenceAge = 4 * time.Second
	}
	if c.Progress <= 0 {
		c.Progress = 2 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 3 * time.Minute
	}
	if c.Log == nil {
		c.Log = logrus.New()
	}
	if len(c.Secret) == 0 {
		c.Secret = []byte("demo-webhook-secret")
	}
}

// Result is everything the summary prints.
type Result struct {
	RunID    string
	Engine   string // EngineMySQL or EnginePostgres
	Database string
	Elapsed  time.Duration

	Driver     DriverStats
	Callbacks  CallbackCounts
	Points     consumer.Stats
	Notify     consumer.Stats
	Search     consumer.Stats
	Injected   int64
	SMSCalls   int64
	SMSSent    int64
	SMSResends int64
	SMSLost    int64
	Throttled  int64
	Restarts   int
	Checks     int64 // check-backs answered by this process
	Quiescent  bool
	Report     Report
}

// CallbackCounts is a snapshot of ServiceStats.
type CallbackCounts struct {
	Received, Applied, Duplicates, Rejected, Unavailable, Resent int64
}

// app holds the running pieces.
type app struct {
	cfg   RunConfig
	names Names
	log   logrus.FieldLogger

	svc      *Service
	httpSrv  *http.Server
	httpURL  string
	gateway  *SMSGateway
	sender   *SMSSender
	sink     *outbox.RocketMQSink
	payDisp  *outbox.Dispatcher
	ordDisp  *outbox.Dispatcher
	smsDisp  *outbox.Dispatcher
	inject   *Injector
	points   *consumer.Consumer
	notifier *consumer.Consumer
	search   *consumer.Consumer

	pmu      sync.Mutex
	producer *txproducer.Producer
	restarts int
	checks   atomic.Int64

	closers []func(ctx context.Context)
}

// Migrate creates every table the example uses: rmqtx's tables with
// schema.Migrate (the transaction log, the consumer's tables and the
// replay audit under the service's prefix; only an outbox under each
// outbox prefix, since each outbox has its own), then the business schema
// of the database's engine (schema_mysql.sql or schema_postgres.sql). It
// is idempotent.
func Migrate(ctx context.Context, db *sqlx.DB) error {
	plans := []schema.Options{{Prefix: rmqtxPrefix, Components: []schema.Component{schema.TxLog, schema.Consumer, schema.Replay}}}
	for _, p := range []string{payOutboxPrefix, orderOutboxPrefix, smsOutboxPrefix} {
		plans = append(plans, schema.Options{Prefix: p, Components: []schema.Component{schema.Outbox}})
	}
	for _, o := range plans {
		if err := schema.Migrate(ctx, db, o); err != nil {
			return err
		}
	}
	for _, stmt := range splitSchema(sqlFor(db.DriverName()).schema) {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("schema: %w", err)
		}
	}
	return nil
}

// splitSchema returns the statements of a schema file without comments.
func splitSchema(sql string) []string {
	var out []string
	for _, stmt := range strings.Split(stripComments(sql), ";") {
		if s := strings.TrimSpace(stmt); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// CreateTopics creates the run's topics on the broker, so the consumers
// can subscribe before the first send.
func CreateTopics(ctx context.Context, nameServer []string, brokerAddr string, topics ...string) error {
	return broker.CreateTopics(ctx, nameServer, brokerAddr, 4, topics...)
}

// Run migrates, starts the service, the producer, the consumers and the
// dispatchers, drives the payments, waits until every derived result has
// caught up (or cfg.Timeout), reconciles and shuts everything down.
func Run(ctx context.Context, cfg RunConfig) (Result, error) {
	cfg.defaults()
	started := time.Now()
	a := &app{cfg: cfg, names: NamesFor(cfg.RunID), log: cfg.Log}
	res := Result{RunID: cfg.RunID, Engine: engineOf(cfg.DB)}
	if err := cfg.DB.GetContext(ctx, &res.Database, sqlFor(cfg.DB.DriverName()).currentDB); err != nil {
		return res, fmt.Errorf("database: %w", err)
	}
	defer a.close()
	if err := a.start(ctx); err != nil {
		return res, err
	}
	d := &Driver{
		Svc: a.svc, URL: a.httpURL + CallbackPath, Secret: cfg.Secret, Log: a.log,
		Client:   &http.Client{Timeout: 30 * time.Second},
		Payments: cfg.Payments, Users: cfg.Users, Concurrency: cfg.Concurrency,
		DupRate: cfg.DupRate, CancelRate: cfg.CancelRate, RedeliverRate: cfg.RedeliverRate,
		RunID: cfg.RunID,
	}
	if !cfg.NoRestart {
		d.Restart = a.restartProducer
	}
	d.StartRelay = func(ctx context.Context) error { return a.ordDisp.Start(ctx) }
	d.Redeliver = a.redeliver
	d.ProjectionPaid = a.projectionPaid

	stop := a.progress(ctx, d)
	err := d.Run(ctx)
	if err != nil {
		stop()
		return res, fmt.Errorf("driver: %w", err)
	}
	res.Quiescent = a.waitQuiescent(ctx, d)
	stop()

	// Stop everything before the final reconciliation and counts.
	a.close()
	res.Elapsed = time.Since(started)
	res.Driver = d.Stats()
	st := &a.svc.Stats
	res.Callbacks = CallbackCounts{st.Callbacks.Load(), st.Applied.Load(), st.Duplicates.Load(), st.Rejected.Load(), st.Unavailable.Load(), st.Resent.Load()}
	res.Points, res.Notify, res.Search = a.points.Processor().Stats(), a.notifier.Processor().Stats(), a.search.Processor().Stats()
	res.Injected = a.inject.Injected.Load()
	res.SMSCalls, res.SMSSent, res.SMSResends, res.SMSLost = a.gateway.Calls.Load(), a.gateway.Delivered.Load(), a.gateway.Resends.Load(), a.gateway.Lost.Load()
	res.Throttled = a.sender.Throttled.Load()
	res.Restarts = a.restarts
	res.Checks = a.checks.Load()
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep, err := Reconcile(rctx, cfg.DB, ReconcileTables(a.names.Groups()))
	if err != nil {
		return res, err
	}
	res.Report = rep
	return res, nil
}

func (a *app) start(ctx context.Context) error {
	cfg := a.cfg
	n := a.names
	libLog := cfg.LibLog
	if err := Migrate(ctx, cfg.DB); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// The consumers create their groups' retry topics when they start.
	if err := CreateTopics(tctx, cfg.NameServers, cfg.Broker, n.PaymentTopic, n.OrderTopic); err != nil {
		return err
	}
	payT, _ := outbox.NewTable(payOutboxPrefix)
	ordT, _ := outbox.NewTable(orderOutboxPrefix)
	smsT, _ := outbox.NewTable(smsOutboxPrefix)

	// The SMS gateway stub and the command outbox's sender.
	a.gateway = &SMSGateway{DB: cfg.DB, Log: a.log, LoseResponse: func(key string) bool { return pick("lost/"+key, cfg.LostSMSRate) }}
	if err := a.gateway.Start(); err != nil {
		return err
	}
	a.closers = append(a.closers, func(ctx context.Context) { _ = a.gateway.Shutdown(ctx) })
	a.sender = &SMSSender{URL: a.gateway.URL(), Client: &http.Client{Timeout: 5 * time.Second},
		Limiter: &UserLimiter{Every: cfg.SMSEvery, Burst: cfg.SMSBurst}}

	// Outbox dispatchers: OrderPaid and order-service events go to the
	// order topic through one RocketMQ sink; SMS commands go to the gateway.
	var err error
	a.sink, err = outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: cfg.NameServers, Group: n.OutboxGroup, Observe: observe.Observe{Logger: libLog}})
	if err != nil {
		return err
	}
	a.closers = append(a.closers, func(context.Context) { _ = a.sink.Close() })
	newDisp := func(t outbox.Table, sink outbox.Sink, name string, backoffMax time.Duration) (*outbox.Dispatcher, error) {
		d, err := outbox.NewDispatcher(outbox.Config{
			DB: cfg.DB, TablePrefix: strings.TrimSuffix(t.Name(), "outbox"), Sink: sink, Name: name,
			PollInterval: 200 * time.Millisecond, LeaseDuration: 15 * time.Second,
			BackoffBase: 100 * time.Millisecond, BackoffMax: backoffMax, MaxRetries: 100,
			Observe: observe.Observe{Logger: libLog},
		})
		if err != nil {
			return nil, err
		}
		a.closers = append(a.closers, func(ctx context.Context) { _ = d.Shutdown(ctx) })
		return d, nil
	}
	if a.payDisp, err = newDisp(payT, a.sink, "pay-relay", 2*time.Second); err != nil {
		return err
	}
	if a.ordDisp, err = newDisp(ordT, a.sink, "order-relay", 2*time.Second); err != nil {
		return err
	}
	if a.smsDisp, err = newDisp(smsT, a.sender.Sink(), "sms-sender", time.Second); err != nil {
		return err
	}
	if err := a.payDisp.Start(ctx); err != nil {
		return err
	}
	if err := a.smsDisp.Start(ctx); err != nil {
		return err
	}
	// The order relay (a.ordDisp) is started by the driver, late on purpose.

	// The payment and order services, and their HTTP endpoint.
	a.svc = &Service{
		DB: cfg.DB, Secret: cfg.Secret, PaymentTopic: n.PaymentTopic, OrderTopic: n.OrderTopic,
		PayOutbox: payT, OrderOutbox: ordT, Log: a.log,
		NotifyPay: a.payDisp.Notify, NotifyOrder: a.ordDisp.Notify,
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	a.httpURL = "http://" + ln.Addr().String()
	a.httpSrv = &http.Server{Handler: a.svc.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = a.httpSrv.Serve(ln) }()
	a.closers = append(a.closers, func(ctx context.Context) { _ = a.httpSrv.Shutdown(ctx) })

	// The transactional producer, with its check-back listener and discard
	// recovery, in this process.
	p, err := a.newProducer(ctx)
	if err != nil {
		return err
	}
	a.producer = p
	a.svc.SetProducer(p)
	a.closers = append(a.closers, func(ctx context.Context) {
		a.pmu.Lock()
		p := a.producer
		a.pmu.Unlock()
		a.svc.SetProducer(nil)
		if p != nil {
			_ = p.Shutdown(ctx)
		}
	})

	// Three consumers, each in its own group with its own dedup scope.
	a.inject = &Injector{Rate: cfg.FailRate}
	h := &Handlers{Inject: a.inject, SMSOutbox: smsT, NotifySMS: a.smsDisp.Notify}
	newConsumer := func(group, topic string, routes map[string]consumer.Route) (*consumer.Consumer, error) {
		c, err := consumer.New(consumer.Config{
			Group: group, DB: cfg.DB, TablePrefix: rmqtxPrefix, Routes: routes,
			VersionMode: consumer.VersionMonotonic, Observe: observe.Observe{Logger: libLog},
			NameServers: cfg.NameServers, Topic: topic, Goroutines: 8,
		})
		if err != nil {
			return nil, err
		}
		if err := c.Start(ctx); err != nil {
			return nil, err
		}
		a.closers = append(a.closers, func(ctx context.Context) { _ = c.Shutdown(ctx) })
		return c, nil
	}
	if a.points, err = newConsumer(n.PointsGroup, n.PaymentTopic, h.PointsRoutes(n.PointsGroup)); err != nil {
		return err
	}
	if a.notifier, err = newConsumer(n.NotificationGroup, n.PaymentTopic, h.NotificationRoutes(n.NotificationGroup)); err != nil {
		return err
	}
	if a.search, err = newConsumer(n.SearchGroup, n.OrderTopic, h.SearchRoutes(n.SearchGroup)); err != nil {
		return err
	}
	a.log.WithFields(logrus.Fields{"callback": a.httpURL + CallbackPath, "sms_gateway": a.gateway.URL(),
		"payment_topic": n.PaymentTopic, "order_topic": n.OrderTopic}).Info("service, producer, 3 consumers and 3 outbox dispatchers running")
	return nil
}

func (a *app) newProducer(ctx context.Context) (*txproducer.Producer, error) {
	p, err := txproducer.New(txproducer.Config{
		NameServers: a.cfg.NameServers, Group: a.names.ProducerGroup, DB: a.cfg.DB, TablePrefix: rmqtxPrefix,
		FenceAge: a.cfg.FenceAge, LocalTxTimeout: a.cfg.FenceAge * 3 / 4,
		WarmupTopics: []string{a.names.PaymentTopic},
		Observe:      observe.Observe{Logger: a.cfg.LibLog},
		OnCheck:      func(checkback.Answer) { a.checks.Add(1) },
	})
	if err != nil {
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// restartProducer stops the producer while callbacks keep arriving (they
// get 503 and the gateway retries) and starts a new instance of the same
// group, which answers the checks of the old one's transactions.
func (a *app) restartProducer(ctx context.Context) error {
	a.pmu.Lock()
	defer a.pmu.Unlock()
	old := a.producer
	a.svc.SetProducer(nil)
	a.log.WithField("instance", old.InstanceName()).Info("restarting the transactional producer")
	// Shutdown waits for the Sends in flight. Do not give it a short
	// deadline: stopping rocketmq-client-go under a running
	// SendMessageInTransaction is a data race inside the client.
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := old.Shutdown(sctx); err != nil {
		a.log.WithError(err).Warn("producer shutdown")
	}
	p, err := a.newProducer(ctx)
	if err != nil {
		return fmt.Errorf("restart producer: %w", err)
	}
	a.producer = p
	a.restarts++
	a.svc.SetProducer(p)
	a.log.WithField("instance", p.InstanceName()).Info("transactional producer back")
	return nil
}

// redeliver publishes a committed PaymentSucceeded again, exactly as the
// txlog holds it (same event id, same payload): what a broker redelivery,
// a double commit or an operator replay looks like to the consumers.
func (a *app) redeliver(ctx context.Context, eventID string) error {
	store, err := txlog.New(a.cfg.DB, rmqtxPrefix)
	if err != nil {
		return err
	}
	row, err := store.Get(ctx, eventID)
	if err != nil {
		return err
	}
	if row.State != txlog.StateCommitted || row.Payload == nil {
		return fmt.Errorf("redeliver %s: state %s, payload stored %v", eventID, row.State, row.Payload != nil)
	}
	return a.sink.Send(ctx, &outbox.Message{Event: outbox.Event{
		EventID: row.EventID, EventType: row.EventType, EventVersion: 1, Destination: row.Topic,
		MessageKey: row.BusinessKey, Payload: row.Payload,
	}, Attempt: 1})
}

// projectionPaid counts the given orders the projection shows as PAID.
func (a *app) projectionPaid(ctx context.Context, orderIDs []string) (int, error) {
	if len(orderIDs) == 0 {
		return 0, nil
	}
	q, args, err := sqlx.In(`SELECT COUNT(*) FROM order_search WHERE status = 'PAID' AND order_id IN (?)`, orderIDs)
	if err != nil {
		return 0, err
	}
	var n int
	err = a.cfg.DB.GetContext(ctx, &n, a.cfg.DB.Rebind(q), args...)
	return n, err
}

// progressCounts reads how far the derived results are.
type progressCounts struct {
	Succeeded, Points, Notifications, SMS, Orders, ProjectionMatch, OutboxOpen int
}

func (a *app) counts(ctx context.Context) (progressCounts, error) {
	var c progressCounts
	q := `SELECT
	  (SELECT COUNT(*) FROM payments WHERE status = 'SUCCESS'),
	  (SELECT COUNT(*) FROM points_ledger),
	  (SELECT COUNT(*) FROM notifications),
	  (SELECT COUNT(*) FROM sms_gateway_log),
	  (SELECT COUNT(*) FROM orders),
	  (SELECT COUNT(*) FROM order_search s JOIN orders o ON o.id = s.order_id AND o.status = s.status AND o.version = s.version),
	  (SELECT COUNT(*) FROM pay_outbox WHERE status NOT IN ('SENT','DEAD')) +
	  (SELECT COUNT(*) FROM ord_outbox WHERE status NOT IN ('SENT','DEAD')) +
	  (SELECT COUNT(*) FROM sms_outbox WHERE status NOT IN ('SENT','DEAD'))`
	err := a.cfg.DB.QueryRowxContext(ctx, q).Scan(&c.Succeeded, &c.Points, &c.Notifications, &c.SMS, &c.Orders, &c.ProjectionMatch, &c.OutboxOpen)
	return c, err
}

func (a *app) progress(ctx context.Context, d *Driver) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(a.cfg.Progress)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			c, err := a.counts(ctx)
			if err != nil {
				continue
			}
			ds := d.Stats()
			a.log.Infof("progress: paid %d/%d | points %d | sms %d | projection %d/%d | dup callbacks %d | retried 503s %d | dedup hits %d | outbox backlog %d",
				c.Succeeded, a.cfg.Payments, c.Points, c.SMS, c.ProjectionMatch, c.Orders,
				a.svc.Stats.Duplicates.Load(), ds.Retried503, a.points.Processor().Stats().Duplicates+a.notifier.Processor().Stats().Duplicates+a.search.Processor().Stats().Duplicates,
				c.OutboxOpen)
		}
	}()
	return func() { cancel(); <-done }
}

// waitQuiescent polls until every derived result has caught up with the
// payments: points, notifications, SMS, projection, empty outboxes, the
// redelivered duplicates absorbed, and nothing left for `rmqtx stuck` to
// list (a failed attempt whose retry is still on its way, say of an order
// event that turned stale while it waited, leaves its attempt row until
// the retry). It returns false on cfg.Timeout.
func (a *app) waitQuiescent(ctx context.Context, d *Driver) bool {
	deadline := time.Now().Add(a.cfg.Timeout)
	redelivered := int64(d.Stats().Redelivered)
	tables := ReconcileTables(a.names.Groups())
	for {
		c, err := a.counts(ctx)
		if err == nil &&
			c.Points == c.Succeeded && c.Notifications == c.Succeeded && c.SMS == c.Succeeded &&
			c.ProjectionMatch == c.Orders && c.OutboxOpen == 0 &&
			a.points.Processor().Stats().Duplicates >= redelivered &&
			a.notifier.Processor().Stats().Duplicates >= redelivered {
			stuck, err := stuckRows(ctx, a.cfg.DB, tables)
			if err == nil && len(stuck) == 0 {
				a.log.Info("quiescent: every derived result has caught up")
				return true
			}
			if err == nil {
				a.log.Debugf("caught up but for %d rows rmqtx stuck lists (first: %s %s/%s)", len(stuck), stuck[0].Status, stuck[0].Where, stuck[0].EventID)
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			a.log.Warnf("not quiescent after %s; reconciling what is there", a.cfg.Timeout)
			return false
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// close stops everything in reverse start order. Idempotent.
func (a *app) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i](ctx)
	}
	a.closers = nil
}
