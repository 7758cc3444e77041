package discard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/shutdown"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/rmqmsg"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// Settings of the recovery consumer that are not configurable.
const (
	// maxReconsumeTimes is the broker's limit before it moves a message of
	// the recovery group to %DLQ%. Recovery retries in process and hands a
	// message back only when it stops (or when the client's expired-message
	// cleaner does), so the limit is only a backstop, and it must never
	// send a committed event to a dead-letter topic: the largest value the
	// protocol carries. The client's default (16) did exactly that during a
	// long database outage.
	maxReconsumeTimes = math.MaxInt32
	// consumeTimeout is the client's ConsumeTimeout. The client hands a
	// message back through the retry topic once its callback has run that
	// long; recovery holds a message for as long as an outage lasts, so the
	// client's default (15 minutes) would make extra copies.
	consumeTimeout = 24 * time.Hour
	// handBackDelayLevel is the delay level (1 s) of a message handed back
	// on Shutdown, so that another instance takes it over promptly.
	handBackDelayLevel = 1
	// routeWait bounds waiting for the name server to route the retry
	// topic recovery creates on Start.
	routeWait = 5 * time.Second
)

// Result reports one attempt of recovery on a discarded message.
type Result struct {
	EventID string
	// HalfKey is the discarded half's UNIQ_KEY ("" when it has none): with
	// several halves of one event id, it tells which one this was.
	HalfKey  string
	Topic    string                 // the real topic, from the txlog row ("" when unknown)
	Decision txlog.RecoveryDecision // empty: not ours (other group, probe), already handled, or failed
	MsgID    string                 // republished message id
	Attempt  int                    // 1 for the first attempt on this delivery
	// Redelivered: the message came back through the recovery group's
	// retry topic (its REAL_TOPIC names that topic, not the real one).
	Redelivered bool
	Err         error

	note string // the decision's note (recorded on the row unless it holds another half's decision)
}

var errStopped = errors.New("discard: recovery stopped")

// Recovery consumes Topic for one producer group.
type Recovery struct {
	cfg Config
	tr  *otelx.Tracer // nil: tracing off

	mu       sync.Mutex
	started  bool
	closed   bool
	pub      Publisher
	ownPub   broker.Producer
	pc       broker.PushConsumer // its stop gate stops delivery before it shuts down
	attempt  int
	busy     map[string]chan struct{} // event ids being decided in this process
	inflight sync.WaitGroup           // consume callbacks running
	stop     chan struct{}
	runCtx   context.Context // cancelled by Shutdown: aborts attempts in progress
	cancel   context.CancelFunc
	loopDone chan struct{}
	running  chan struct{} // closed once subscribed
}

// New validates cfg and returns a Recovery that is not started.
func New(cfg Config) (*Recovery, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Recovery{cfg: cfg, tr: otelx.New(cfg.TracerProvider), pub: cfg.Publisher, busy: map[string]chan struct{}{}, stop: make(chan struct{}),
		runCtx: ctx, cancel: cancel, loopDone: make(chan struct{}), running: make(chan struct{})}, nil
}

// Start starts the republish producer and subscribes to Topic in the
// background: until the broker has created the topic (on its first
// discard) it looks for its route every StartRetry. Running reports when
// the subscription is live.
func (r *Recovery) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("discard: recovery is shut down")
	}
	if r.started {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("discard: start: %w", err)
	}
	rmqlog.Install(r.cfg.Logger)
	if r.pub == nil {
		p, err := broker.NewProducer(broker.ProducerConfig{
			NameServers:  r.cfg.NameServers,
			Group:        r.cfg.PublisherGroup,
			InstanceName: r.cfg.InstanceName + "-pub",
			SendTimeout:  r.cfg.SendTimeout,
			Retries:      2,
			// The queue of the event's aggregate (RepublishMessage sets
			// the key), as txproducer.Send chose it.
			Selector: rmqroute.New(),
		})
		if err != nil {
			return fmt.Errorf("discard: publisher: %w", err)
		}
		if err := p.Start(); err != nil {
			return fmt.Errorf("discard: publisher start: %w", err)
		}
		r.ownPub, r.pub = p, p
	}
	r.started = true
	go r.loop()
	return nil
}

// Running returns a channel closed once the Topic subscription is live.
func (r *Recovery) Running() <-chan struct{} { return r.running }

func (r *Recovery) loop() {
	defer close(r.loopDone)
	for {
		err := r.subscribe()
		if err == nil {
			close(r.running)
			return
		}
		if errors.Is(err, errStopped) {
			return
		}
		r.cfg.Logger.WithError(err).Debug("discard: not subscribed yet; retrying")
		t := time.NewTimer(r.cfg.StartRetry)
		select {
		case <-r.stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (r *Recovery) subscribe() error {
	// One name server request per try; the client is built only once the
	// topic exists (its Start fails without a route).
	ctx, cancel := context.WithTimeout(r.runCtx, 2*routeWait)
	defer cancel()
	brokers, err := remoting.MasterBrokers(ctx, r.cfg.NameServers, 0, Topic)
	if err != nil {
		if r.runCtx.Err() != nil {
			return errStopped
		}
		return fmt.Errorf("discard: route of %s: %w", Topic, err)
	}
	r.ensureRetryTopic(ctx, brokers)

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errStopped
	}
	r.attempt++
	// The seam's stop gate stops delivery before the client shuts down
	// (Shutdown calls pc.Close): the upstream
	// client's Shutdown can close a pull queue's channel that a pull
	// goroutine still sends on (apache/rocketmq-client-go#1051), a panic
	// with no recover.
	pc, err := broker.NewPushConsumer(broker.PushConsumerConfig{
		Group:             r.cfg.ConsumerGroup,
		NameServers:       r.cfg.NameServers,
		InstanceName:      fmt.Sprintf("%s-%d", r.cfg.InstanceName, r.attempt),
		FromWhere:         broker.ConsumeFromFirstOffset,
		BatchSize:         1,
		MaxReconsumeTimes: maxReconsumeTimes,
		ConsumeTimeout:    consumeTimeout,
	})
	if err != nil {
		return fmt.Errorf("discard: consumer: %w", err)
	}
	if err := pc.Subscribe(Topic, broker.MessageSelector{}, r.consume); err != nil {
		_ = pc.Shutdown() // never started: no queue is being pulled
		return fmt.Errorf("discard: subscribe: %w", err)
	}
	if err := pc.Start(); err != nil {
		// Start shuts the consumer down itself when the topic has no route.
		return fmt.Errorf("discard: consumer start: %w", err)
	}
	r.pc = pc
	return nil
}

// ensureRetryTopic creates the recovery group's retry topic
// (%RETRY%<ConsumerGroup>, one queue) on Topic's brokers before the client
// starts, and waits until the name server routes it
// (broker.EnsureRetryTopic): a message handed back on Shutdown would
// otherwise wait for the client's route refresh (30 s). Best effort: the
// broker creates the topic itself on the first hand-back.
func (r *Recovery) ensureRetryTopic(ctx context.Context, brokers []string) {
	err := broker.EnsureRetryTopic(ctx, broker.RetryTopicSpec{NameServers: r.cfg.NameServers, Group: r.cfg.ConsumerGroup,
		Brokers: brokers, Topic: Topic, RouteWait: routeWait})
	if err == nil {
		return
	}
	log := r.cfg.Logger.WithField("retry_topic", broker.RetryTopic(r.cfg.ConsumerGroup))
	if errors.Is(err, broker.ErrRetryTopicNotRouted) {
		log.Debug("discard: the recovery group's retry topic is not routed yet")
		return
	}
	log.WithError(err).Warn("discard: could not create the recovery group's retry topic; handed-back messages may wait for a route refresh")
}

// consume is the subscription's callback. Each message is retried in
// process until it is decided; only when recovery stops is it handed back
// to the broker (or, if the client already dropped the queue, redelivered
// from its unacknowledged offset), for this or another instance.
func (r *Recovery) consume(ctx context.Context, msgs ...*broker.MessageExt) (broker.ConsumeResult, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		for _, m := range msgs {
			if r.ours(m) {
				return handBack(ctx), nil
			}
		}
		return broker.ConsumeSuccess, nil // other groups' messages: nothing to decide
	}
	r.inflight.Add(1)
	r.mu.Unlock()
	defer r.inflight.Done()
	for _, m := range msgs {
		if !r.decide(m) {
			return handBack(ctx), nil
		}
	}
	return broker.ConsumeSuccess, nil
}

func handBack(ctx context.Context) broker.ConsumeResult {
	broker.SetNextDelayLevel(ctx, handBackDelayLevel)
	return broker.ConsumeRetryLater
}

// attemptState carries what earlier attempts on one delivery achieved.
type attemptState struct {
	fenced    bool   // this delivery's fence wrote the row
	republish string // message id of a republish whose MarkRecovered failed
}

// decide handles m until it is decided; it returns false when recovery
// stopped first.
func (r *Recovery) decide(m *broker.MessageExt) bool {
	if !r.ours(m) {
		_, _ = r.Handle(r.runCtx, m) // not ours, or logged and left alone
		return true
	}
	id := m.GetProperty(wire.PropEventID)
	release, ok := r.acquire(id)
	if !ok {
		return false
	}
	defer release()
	metrics.Add(r.cfg.Metrics, undecidedVec, 1, r.cfg.Group)
	defer metrics.Add(r.cfg.Metrics, undecidedVec, -1, r.cfg.Group)
	var st attemptState
	for attempt := 1; ; attempt++ {
		if _, err := r.handle(r.runCtx, m, attempt, &st); err == nil {
			return true
		}
		t := time.NewTimer(r.backoff(attempt))
		select {
		case <-r.stop:
			t.Stop()
			return false
		case <-t.C:
		}
	}
}

// ours reports whether m is a discarded half of this producer group that
// recovery must decide.
func (r *Recovery) ours(m *broker.MessageExt) bool {
	return m.GetProperty(broker.PropProducerGroup) == r.cfg.Group && m.GetProperty(checkback.PropProbe) == "" &&
		m.GetProperty(wire.PropEventID) != ""
}

// acquire makes sure one event id is decided by one goroutine at a time in
// this process (the broker may discard several copies of a half, and the
// client may hand a held message back): a second delivery waits for the
// first to finish, then finds the decision in the txlog.
func (r *Recovery) acquire(id string) (release func(), ok bool) {
	for {
		r.mu.Lock()
		ch, busy := r.busy[id]
		if !busy {
			ch = make(chan struct{})
			r.busy[id] = ch
			r.mu.Unlock()
			return func() {
				r.mu.Lock()
				delete(r.busy, id)
				r.mu.Unlock()
				close(ch)
			}, true
		}
		r.mu.Unlock()
		select {
		case <-ch:
		case <-r.stop:
			return nil, false
		}
	}
}

// backoff is the wait after failed attempt n: RetryBackoff doubled per
// failure, capped at RetryMaxBackoff, drawn between half and all of it so
// instances and messages do not retry in lockstep.
func (r *Recovery) backoff(n int) time.Duration {
	d := r.cfg.RetryMaxBackoff
	if n < 31 {
		if b := r.cfg.RetryBackoff << (n - 1); b > 0 && b < d {
			d = b
		}
	}
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

func undecidedVec(m *metrics.Metrics) *prometheus.GaugeVec { return m.DiscardUndecided }

func fencesVec(m *metrics.Metrics) *prometheus.CounterVec { return m.CheckbackFences }

// Handle decides one discarded half message in one attempt. It is what the
// subscription calls (again after each failure); it is exported for tools
// that read Topic themselves. A non-nil error means "try again later".
// Every decision comes from the txlog row: the message only gives the event
// id to look up, and the UNIQ_KEY and payload hash that tell whether it is
// the half that committed.
func (r *Recovery) Handle(ctx context.Context, m *rmqmsg.MessageExt) (Result, error) {
	return r.handle(ctx, m, 1, &attemptState{})
}

func (r *Recovery) handle(ctx context.Context, m *broker.MessageExt, attempt int, st *attemptState) (res Result, err error) {
	q := checkback.QueryFromMessage(m) // Topic is "" for a redelivered message
	res = Result{EventID: q.EventID, HalfKey: q.HalfKey, Attempt: attempt, Redelivered: checkback.Redelivered(m)}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("discard: panic while recovering %s: %v", q.EventID, rmqlog.ScrubValue(p))
		}
		res.Err = err
		r.report(res)
	}()
	if q.Group != r.cfg.Group || m.GetProperty(checkback.PropProbe) != "" {
		return res, nil
	}
	if q.EventID == "" {
		r.cfg.Logger.WithField("msg_id", m.MsgId).Warn("discard: discarded half message without an rmqtx event id; left alone")
		return res, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout+r.cfg.SendTimeout)
	defer cancel()

	row, err := r.cfg.Log.Get(ctx, q.EventID)
	if errors.Is(err, txlog.ErrNotFound) || (err == nil && txlog.Retakable(row, q.HalfKey)) {
		// Never ran, or still running: fence. A row rolled back for
		// another half of the id does not decide this half either (a Send
		// retrying the id may be taking it over with this half): the fence
		// waits for that and makes sure this half can never commit after.
		// The topic is informational on a ROLLED_BACK row; it is recorded
		// only when the broker's REAL_TOPIC can be trusted (not after a
		// retry). The row names this half (txlog.HalfProperties).
		var fenced bool
		fr := txlog.Row{EventID: q.EventID, ProducerGroup: r.cfg.Group, Topic: q.Topic, Tags: q.Tags, Keys: q.Keys,
			EventType: q.EventType, BusinessKey: q.BusinessKey, PayloadHash: q.PayloadHash, ResolvedBy: txlog.ByRecovery,
			Properties: txlog.HalfProperties(q.HalfKey)}
		row, fenced, err = r.cfg.Log.Fence(ctx, fr)
		if err == nil && fenced {
			st.fenced = true
			metrics.Inc(r.cfg.Metrics, fencesVec, r.cfg.Group)
		}
	}
	if err != nil {
		return res, fmt.Errorf("discard: recovery of %s: %w", q.EventID, err)
	}
	res.Topic = row.Topic
	if row.State == txlog.StateRolledBack {
		switch {
		case st.fenced && row.RecoveredAt.IsZero():
			res.Decision = txlog.RecoveryFenced
			err = r.mark(ctx, &res, "discarded by the broker with no txlog row")
			return res, err
		case row.RecoveredAt.IsZero():
			res.Decision = txlog.RecoveryDropped
			err = r.mark(ctx, &res, "rolled back")
			return res, err
		}
		return res, nil
	}
	// COMMITTED. First: is this the half that committed the row? Only
	// that one may become a copy of the event (the check answer applies
	// the same rule).
	if checkback.OtherHalf(row, q.HalfKey) {
		// A retried or racing Send's half; the half that committed
		// delivers the event. Republishing this one, under its own
		// UNIQ_KEY, would put a second copy on the topic.
		err = r.other(ctx, &res, row, txlog.RecoveryDropped,
			"not the committed half: UNIQ_KEY "+q.HalfKey+", the row's is "+checkback.CommittedHalf(row))
		return res, err
	}
	if bodyHash := wire.Hash(m.Body); (q.PayloadHash != "" && q.PayloadHash != bodyHash) || (row.PayloadHash != "" && row.PayloadHash != bodyHash) {
		// Not the half that committed either (an event id reused with
		// another payload, whose local transaction failed on the duplicate
		// key).
		err = r.other(ctx, &res, row, txlog.RecoveryConflict, "half payload hash "+bodyHash+" differs from the committed row")
		return res, err
	}
	switch row.RecoveryDecision {
	case txlog.RecoveryRepublished:
		return res, nil // a second discarded copy of the same transaction
	case txlog.RecoveryNoPayload:
		return res, nil // already decided and alerted
	}
	if st.republish == "" {
		msg, err := RepublishMessage(row)
		if errors.Is(err, ErrNotRepublishable) {
			res.Decision = txlog.RecoveryNoPayload
			err = r.mark(ctx, &res, notRepublishable(row))
			return res, err
		}
		if msg.GetProperty(broker.PropUniqKey) == "" && q.HalfKey != "" {
			// A row that does not record its half's UNIQ_KEY (written
			// before rmqtx did): keep the discarded half's, so consumers
			// see the id of the original send. An identifier only, never
			// used to decide.
			msg.WithProperty(broker.PropUniqKey, q.HalfKey)
		}
		if r.pub == nil {
			return res, errors.New("discard: recovery is not started (no publisher)")
		}
		sctx, scancel := context.WithTimeout(ctx, r.cfg.SendTimeout)
		defer scancel()
		sctx, sp := r.tr.StartFromMessage(sctx, msg, otelx.SpanRepublish, trace.SpanKindProducer, otelx.Attrs{Destination: row.Topic, Group: r.cfg.Group})
		r.tr.InjectMessage(sctx, msg)
		sr, err := r.pub.SendSync(sctx, msg)
		sp.EndSend(sr, err)
		if err != nil {
			// The broker's answer is named as every sender names it
			// (internal/broker/brokerclass): a missing topic says to create it.
			if d := brokerclass.Describe(err); d != "" {
				return res, fmt.Errorf("discard: republish %s to %s (%s): %w", q.EventID, row.Topic, d, err)
			}
			return res, fmt.Errorf("discard: republish %s: %w", q.EventID, err)
		}
		if err := broker.CheckSendResult(sr); err != nil {
			return res, fmt.Errorf("discard: republish %s: broker %w", q.EventID, err)
		}
		st.republish = sr.MsgID
		failpoint.Inject(failpoint.AfterRepublish)
	}
	res.Decision, res.MsgID = txlog.RecoveryRepublished, st.republish
	err = r.mark(ctx, &res, "republished as "+st.republish)
	return res, err
}

// other decides a half message that did not commit row, as d. The row
// belongs to the half that did: the decision is recorded on it only while
// it holds none, and never overwrites what recovery decided about the
// committed half (REPUBLISHED, NO_PAYLOAD) or about another half. It is
// always logged and counted, except for a second discarded copy of a half
// already recorded (same decision and note).
func (r *Recovery) other(ctx context.Context, res *Result, row txlog.Row, d txlog.RecoveryDecision, note string) error {
	switch {
	case row.RecoveryDecision == "":
		res.Decision = d
		return r.mark(ctx, res, note)
	case row.RecoveryDecision == d && row.RecoveryNote == note:
		return nil // this half was decided and recorded before
	}
	res.Decision, res.note = d, note
	return nil
}

func (r *Recovery) mark(ctx context.Context, res *Result, note string) error {
	res.note = note
	id, d := res.EventID, res.Decision
	if err := r.cfg.Log.MarkRecovered(ctx, id, d, note); err != nil {
		return fmt.Errorf("discard: recovery of %s: record %s: %w", id, d, err)
	}
	return nil
}

func (r *Recovery) report(res Result) {
	if res.Decision == "" && res.Err == nil {
		return
	}
	decision := strings.ToLower(string(res.Decision))
	l := r.cfg.Logger.WithFields(logrus.Fields{"event_id": res.EventID, "half": res.HalfKey, "topic": res.Topic,
		"decision": res.Decision, "msg_id": res.MsgID, "attempt": res.Attempt, "redelivered": res.Redelivered})
	switch {
	case res.Err != nil:
		decision = "failed"
		l = l.WithError(res.Err)
		if res.Attempt == 1 || res.Attempt%20 == 0 {
			l.Warn("discard: recovery attempt failed; retrying until decided")
		} else {
			l.Debug("discard: recovery attempt failed; retrying until decided")
		}
	case res.Decision == txlog.RecoveryNoPayload:
		l.WithField("note", res.note).Error("discard: a committed event the broker discarded cannot be republished from the txlog; it is NOT delivered: publish it by hand")
	case res.Decision == txlog.RecoveryConflict:
		l.WithField("note", res.note).Error("discard: discarded half message does not match the committed row; dropped")
	default:
		l.WithField("note", res.note).Info("discard: recovered a discarded half message")
	}
	metrics.Inc(r.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.DiscardRecoveries }, r.cfg.Group, decision)
	if r.cfg.OnDecision != nil {
		func() {
			defer func() { _ = recover() }()
			r.cfg.OnDecision(res)
		}()
	}
}

// Shutdown stops the subscription and the republish producer. Messages
// still undecided are handed back (or redelivered from their
// unacknowledged offset) to this group's next instance. It waits for
// attempts in progress to stop, bounded by ctx. It is idempotent.
func (r *Recovery) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	started := r.started
	close(r.stop)
	r.cancel()
	r.mu.Unlock()
	if !started {
		return nil
	}
	done := make(chan struct{})
	go func() {
		<-r.loopDone
		r.inflight.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("discard: shutdown: %w", ctx.Err())
	}
	var errs []error
	if r.pc != nil {
		// Delivery stops first, then the client shuts down (pushstop).
		if err := r.pc.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if r.ownPub != nil {
		if err := r.ownPub.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("discard: shutdown: %w", err)
	}
	return nil
}

// Close is Shutdown bounded by shutdown.DefaultCloseTimeout (30 s), the
// bound every rmqtx Close shares.
func (r *Recovery) Close() error { return shutdown.Close(r.Shutdown) }
