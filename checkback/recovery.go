package checkback

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/remoting"
	"github.com/rmqtx/rmqtx/internal/rmqlog"
	"github.com/rmqtx/rmqtx/internal/shutdown"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/txlog"
)

// DiscardTopic is where the broker moves a half message after
// transactionCheckMax checks (TopicValidator.RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC).
// The broker creates it (1 queue, read/write) on the first discard; the
// message keeps its body, sysflag and every property (REAL_TOPIC, PGROUP,
// UNIQ_KEY, our envelope), and is consumable like any other message.
const DiscardTopic = "TRANS_CHECK_MAX_TIME_TOPIC"

// Default recovery settings.
const (
	DefaultStartRetry      = 5 * time.Second
	DefaultSendTimeout     = 3 * time.Second
	DefaultRetryBackoff    = 500 * time.Millisecond
	DefaultRetryMaxBackoff = 5 * time.Second
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

// stripped are properties that must never be carried onto a republished
// message: transaction markers, broker bookkeeping and retry bookkeeping.
// The republished message is built from the txlog row (RepublishMessage);
// the row's stored properties are filtered through this list too, so a
// stray system property in them cannot turn the republish into something
// else.
var stripped = map[string]bool{
	primitive.PropertyTransactionPrepared:            true,
	primitive.PropertyProducerGroup:                  true,
	primitive.PropertyRealTopic:                      true,
	primitive.PropertyRealQueueId:                    true,
	primitive.PropertyTransactionID:                  true,
	primitive.PropertyTranscationCheckTimes:          true,
	primitive.PropertyCheckImmunityTimeInSeconds:     true,
	primitive.PropertyTranscationPreparedQueueOffset: true,
	primitive.PropertyMinOffset:                      true,
	primitive.PropertyMaxOffset:                      true,
	primitive.PropertyRetryTopic:                     true,
	primitive.PropertyOriginMessageId:                true,
	primitive.PropertyReconsumeTime:                  true,
	primitive.PropertyMaxReconsumeTimes:              true,
	primitive.PropertyConsumeStartTime:               true,
	primitive.PropertyDelayTimeLevel:                 true,
	primitive.PropertyTimerDeliverMS:                 true,
	primitive.PropertyCluster:                        true,
	primitive.PropertyMsgRegion:                      true,
	primitive.PropertyTraceSwitch:                    true,
}

// RepublishProperties returns the properties to put on the normal message
// that replaces a discarded half message.
func RepublishProperties(props map[string]string) map[string]string {
	out := make(map[string]string, len(props))
	for k, v := range props {
		if !stripped[k] {
			out[k] = v
		}
	}
	return out
}

// RepublishMessage builds the normal message that replaces a discarded half
// message, from the txlog row alone: topic, tags, keys, stored properties
// (the envelope) and payload. Nothing is taken from the discarded message,
// whose REAL_TOPIC the broker rewrites when it passes through a retry. It
// returns an error wrapping ErrNotRepublishable when the row lacks what a
// republish needs.
func RepublishMessage(row txlog.Row) (*primitive.Message, error) {
	if reason := notRepublishable(row); reason != "" {
		return nil, fmt.Errorf("%w: %s: %s", ErrNotRepublishable, row.EventID, reason)
	}
	props := map[string]string{}
	if row.Properties != "" {
		_ = json.Unmarshal([]byte(row.Properties), &props) // notRepublishable checked it
	}
	props = RepublishProperties(props)
	// The columns win over their copies in the stored properties.
	props[envelope.PropEventID] = row.EventID
	for k, v := range map[string]string{envelope.PropEventType: row.EventType, envelope.PropBusinessKey: row.BusinessKey,
		envelope.PropPayloadHash: row.PayloadHash} {
		if v != "" {
			props[k] = v
		}
	}
	msg := primitive.NewMessage(row.Topic, row.Payload)
	msg.WithProperties(props) // replaces the map: tags and keys after it
	if row.Tags != "" {
		msg.WithTag(row.Tags)
	}
	if keys := strings.Fields(row.Keys); len(keys) > 0 {
		msg.WithKeys(keys)
	}
	return msg, nil
}

// ErrNotRepublishable is wrapped when a COMMITTED txlog row cannot be
// published again from the log (see txlog.RecoveryNoPayload).
var ErrNotRepublishable = errors.New("checkback: committed row cannot be republished from the txlog")

// notRepublishable says why row cannot be republished, or "".
func notRepublishable(row txlog.Row) string {
	switch {
	case row.Topic == "":
		return "the row has no topic"
	case len(row.Payload) == 0 && row.PayloadHash != envelope.Hash(nil):
		return "no payload stored (payload storage disabled, or a resolver's decision)"
	case row.PayloadHash != "" && envelope.Hash(row.Payload) != row.PayloadHash:
		return "the stored payload does not match its hash"
	case row.Properties != "" && json.Unmarshal([]byte(row.Properties), &map[string]string{}) != nil:
		return "the stored properties are not a JSON object of strings"
	}
	return ""
}

// Redelivered reports whether m came back through a consumer retry (the
// broker's delay queue and a %RETRY% topic) rather than straight from the
// topic it was stored in. The broker rewrites REAL_TOPIC of such a message
// to the retry topic.
func Redelivered(m *primitive.MessageExt) bool {
	if m.ReconsumeTimes > 0 || m.GetProperty(primitive.PropertyRetryTopic) != "" {
		return true
	}
	rt := m.GetProperty(primitive.PropertyRealTopic)
	return strings.HasPrefix(rt, "%RETRY%") || strings.HasPrefix(rt, "%DLQ%")
}

// RecoveryLog is the part of *txlog.Store that recovery uses.
type RecoveryLog interface {
	Log
	MarkRecovered(ctx context.Context, id string, d txlog.RecoveryDecision, note string) error
}

// Publisher sends a normal message (recovery's republish path). The default
// is a rocketmq-client-go producer in its own group.
type Publisher interface {
	SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error)
}

// RecoveryConfig configures a Recovery.
type RecoveryConfig struct {
	// NameServers lists name server addresses (host:port). Required.
	NameServers []string
	// NameServer is the old spelling of NameServers; WithDefaults copies it
	// into an empty NameServers, and NewRecovery rejects the two set
	// differently.
	//
	// Deprecated: use NameServers.
	NameServer []string
	// Group is the producer group whose discarded half messages are
	// recovered (the PGROUP property). Required.
	Group string
	// Log is the transaction log. Required. Recovery decides from it only.
	Log RecoveryLog
	// ConsumerGroup consumes DiscardTopic. Default Group+"-recovery". All
	// instances of the producer group share it; the topic has one queue,
	// so one instance recovers at a time.
	ConsumerGroup string
	// PublisherGroup is the normal producer group used to republish.
	// Default Group+"-republish" (distinct from the transactional group).
	PublisherGroup string
	// InstanceName is the client instance name. Default
	// ConsumerGroup+"-"+a random suffix, new for every Recovery.
	InstanceName string
	// StartRetry is how often to look for DiscardTopic's route while the
	// topic does not exist yet (the broker creates it on the first
	// discard); each look is one name server request. Default
	// DefaultStartRetry (5 s).
	StartRetry time.Duration
	// SendTimeout bounds one republish. Default DefaultSendTimeout (3 s).
	SendTimeout time.Duration
	// QueryTimeout bounds the txlog queries for one message. Default
	// DefaultQueryTimeout (3 s).
	QueryTimeout time.Duration
	// RetryBackoff is the wait after the first failed attempt to decide a
	// discarded message (database or broker unreachable). Recovery retries
	// in process until the message is decided or Shutdown: it never gives a
	// committed event up. The wait doubles after each failure up to
	// RetryMaxBackoff, each one drawn at random between half and all of
	// it. Default DefaultRetryBackoff (500 ms); negative is invalid.
	RetryBackoff time.Duration
	// RetryMaxBackoff caps the wait between attempts, and so how long
	// recovery may lag once its database is back. Default
	// DefaultRetryMaxBackoff (5 s); must not be below RetryBackoff.
	RetryMaxBackoff time.Duration
	// Metrics records DiscardRecoveries and DiscardUndecided. Default nil.
	Metrics *metrics.Metrics
	// Logger receives one line per decision and per failed attempt (Warn
	// for the first and every 20th, Debug otherwise). Default quiet.
	Logger logrus.FieldLogger
	// OnDecision, when set, is called after each attempt on a message of
	// the group (decided or failed). Default none.
	OnDecision func(RecoveryResult)
	// Publisher overrides the republish producer (tests). Default: a
	// producer created and owned by the Recovery.
	Publisher Publisher
	// TracerProvider traces republishes: a span (otelx.SpanRepublish) that
	// is a child of the trace context stored with the txlog row (the Send's),
	// and whose context the republished message carries. Default nil: no
	// tracing, no cost (the stored trace context is still passed on).
	TracerProvider trace.TracerProvider
}

// WithDefaults returns a copy of c with defaults filled in.
func (c RecoveryConfig) WithDefaults() RecoveryConfig {
	if len(c.NameServers) == 0 {
		c.NameServers = c.NameServer
	}
	if c.ConsumerGroup == "" && c.Group != "" {
		c.ConsumerGroup = c.Group + "-recovery"
	}
	if c.PublisherGroup == "" && c.Group != "" {
		c.PublisherGroup = c.Group + "-republish"
	}
	if c.InstanceName == "" {
		c.InstanceName = c.ConsumerGroup + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	}
	if c.StartRetry <= 0 {
		c.StartRetry = DefaultStartRetry
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.RetryMaxBackoff == 0 {
		c.RetryMaxBackoff = max(DefaultRetryMaxBackoff, c.RetryBackoff)
	}
	c.Logger = rmqlog.OrQuiet(c.Logger)
	return c
}

func (c RecoveryConfig) validate() error {
	switch {
	case len(c.NameServer) > 0 && !slices.Equal(c.NameServer, c.NameServers):
		return fmt.Errorf("%w: NameServer (deprecated) and NameServers are both set and differ; set NameServers only", ErrConfig)
	case len(c.NameServers) == 0:
		return fmt.Errorf("%w: NameServers is required", ErrConfig)
	case c.Group == "":
		return fmt.Errorf("%w: Group is required", ErrConfig)
	case c.Log == nil:
		return fmt.Errorf("%w: Log is required", ErrConfig)
	case c.RetryBackoff < 0:
		return fmt.Errorf("%w: RetryBackoff %s is negative", ErrConfig, c.RetryBackoff)
	case c.RetryMaxBackoff < c.RetryBackoff:
		return fmt.Errorf("%w: RetryMaxBackoff %s is below RetryBackoff %s", ErrConfig, c.RetryMaxBackoff, c.RetryBackoff)
	}
	return nil
}

// RecoveryResult reports one attempt of recovery on a discarded message.
type RecoveryResult struct {
	EventID  string
	Topic    string                 // the real topic, from the txlog row ("" when unknown)
	Decision txlog.RecoveryDecision // empty: not ours (other group, probe), already handled, or failed
	MsgID    string                 // republished message id
	Attempt  int                    // 1 for the first attempt on this delivery
	// Redelivered: the message came back through the recovery group's
	// retry topic (its REAL_TOPIC names that topic, not the real one).
	Redelivered bool
	Err         error

	note string // what was recorded as the row's recovery note
}

var errStopped = errors.New("checkback: recovery stopped")

// Recovery consumes DiscardTopic for one producer group.
type Recovery struct {
	cfg RecoveryConfig
	tr  *otelx.Tracer // nil: tracing off

	mu       sync.Mutex
	started  bool
	closed   bool
	pub      Publisher
	ownPub   rocketmq.Producer
	pc       rocketmq.PushConsumer
	attempt  int
	busy     map[string]chan struct{} // event ids being decided in this process
	inflight sync.WaitGroup           // consume callbacks running
	stop     chan struct{}
	runCtx   context.Context // cancelled by Shutdown: aborts attempts in progress
	cancel   context.CancelFunc
	loopDone chan struct{}
	running  chan struct{} // closed once subscribed
}

// NewRecovery validates cfg and returns a Recovery that is not started.
func NewRecovery(cfg RecoveryConfig) (*Recovery, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Recovery{cfg: cfg, tr: otelx.New(cfg.TracerProvider), pub: cfg.Publisher, busy: map[string]chan struct{}{}, stop: make(chan struct{}),
		runCtx: ctx, cancel: cancel, loopDone: make(chan struct{}), running: make(chan struct{})}, nil
}

// Start starts the republish producer and subscribes to DiscardTopic in the
// background: until the broker has created the topic (on its first
// discard) it looks for its route every StartRetry. Running reports when
// the subscription is live.
func (r *Recovery) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("checkback: recovery is shut down")
	}
	if r.started {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("checkback: recovery start: %w", err)
	}
	rmqlog.Install(r.cfg.Logger)
	if r.pub == nil {
		p, err := rocketmq.NewProducer(
			producer.WithGroupName(r.cfg.PublisherGroup),
			producer.WithInstanceName(r.cfg.InstanceName+"-pub"),
			producer.WithNsResolver(primitive.NewPassthroughResolver(r.cfg.NameServers)),
			producer.WithSendMsgTimeout(r.cfg.SendTimeout),
			producer.WithRetry(2),
		)
		if err != nil {
			return fmt.Errorf("checkback: recovery publisher: %w", err)
		}
		if err := p.Start(); err != nil {
			return fmt.Errorf("checkback: recovery publisher start: %w", err)
		}
		r.ownPub, r.pub = p, p
	}
	r.started = true
	go r.loop()
	return nil
}

// Running returns a channel closed once the DiscardTopic subscription is live.
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
		r.cfg.Logger.WithError(err).Debug("checkback: recovery not subscribed yet; retrying")
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
	brokers, err := remoting.MasterBrokers(ctx, r.cfg.NameServers, 0, DiscardTopic)
	if err != nil {
		if r.runCtx.Err() != nil {
			return errStopped
		}
		return fmt.Errorf("checkback: recovery: route of %s: %w", DiscardTopic, err)
	}
	r.ensureRetryTopic(ctx, brokers)

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errStopped
	}
	r.attempt++
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithGroupName(r.cfg.ConsumerGroup),
		consumer.WithInstance(fmt.Sprintf("%s-%d", r.cfg.InstanceName, r.attempt)),
		consumer.WithNsResolver(primitive.NewPassthroughResolver(r.cfg.NameServers)),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumeMessageBatchMaxSize(1),
		consumer.WithMaxReconsumeTimes(maxReconsumeTimes),
		consumer.WithConsumeTimeout(consumeTimeout),
	)
	if err != nil {
		return fmt.Errorf("checkback: recovery consumer: %w", err)
	}
	if err := pc.Subscribe(DiscardTopic, consumer.MessageSelector{}, r.consume); err != nil {
		_ = pc.Shutdown()
		return fmt.Errorf("checkback: recovery subscribe: %w", err)
	}
	if err := pc.Start(); err != nil {
		// Start shuts the consumer down itself when the topic has no route.
		return fmt.Errorf("checkback: recovery consumer start: %w", err)
	}
	r.pc = pc
	return nil
}

// ensureRetryTopic creates the recovery group's retry topic
// (%RETRY%<ConsumerGroup>, one queue) on DiscardTopic's brokers before the
// client starts, and waits until the name server routes it. The client
// learns the route of a topic created later only on its periodic refresh
// (30 s), so a message handed back on Shutdown would otherwise wait that
// long. Best effort: the broker creates the topic itself on the first
// hand-back.
func (r *Recovery) ensureRetryTopic(ctx context.Context, brokers []string) {
	retry := "%RETRY%" + r.cfg.ConsumerGroup
	if _, err := remoting.MasterBrokers(ctx, r.cfg.NameServers, 0, retry); err == nil {
		return
	}
	log := r.cfg.Logger.WithField("retry_topic", retry)
	for _, addr := range brokers {
		if err := remoting.CreateTopic(ctx, addr, 0, retry, 1); err != nil {
			log.WithError(err).Warn("checkback: recovery could not create its retry topic; handed-back messages may wait for a route refresh")
			return
		}
	}
	deadline := time.Now().Add(routeWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := remoting.MasterBrokers(ctx, r.cfg.NameServers, 0, retry); err == nil {
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	log.Debug("checkback: recovery retry topic not routed yet")
}

// consume is the subscription's callback. Each message is retried in
// process until it is decided; only when recovery stops is it handed back
// to the broker (or, if the client already dropped the queue, redelivered
// from its unacknowledged offset), for this or another instance.
func (r *Recovery) consume(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		for _, m := range msgs {
			if r.ours(m) {
				return handBack(ctx), nil
			}
		}
		return consumer.ConsumeSuccess, nil // other groups' messages: nothing to decide
	}
	r.inflight.Add(1)
	r.mu.Unlock()
	defer r.inflight.Done()
	for _, m := range msgs {
		if !r.decide(m) {
			return handBack(ctx), nil
		}
	}
	return consumer.ConsumeSuccess, nil
}

func handBack(ctx context.Context) consumer.ConsumeResult {
	if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
		cc.DelayLevelWhenNextConsume = handBackDelayLevel
	}
	return consumer.ConsumeRetryLater
}

// attemptState carries what earlier attempts on one delivery achieved.
type attemptState struct {
	fenced    bool   // this delivery's fence wrote the row
	republish string // message id of a republish whose MarkRecovered failed
}

// decide handles m until it is decided; it returns false when recovery
// stopped first.
func (r *Recovery) decide(m *primitive.MessageExt) bool {
	if !r.ours(m) {
		_, _ = r.Handle(r.runCtx, m) // not ours, or logged and left alone
		return true
	}
	id := m.GetProperty(envelope.PropEventID)
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
func (r *Recovery) ours(m *primitive.MessageExt) bool {
	return m.GetProperty(primitive.PropertyProducerGroup) == r.cfg.Group && m.GetProperty(PropProbe) == "" &&
		m.GetProperty(envelope.PropEventID) != ""
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

// Handle decides one discarded half message in one attempt. It is what the
// subscription calls (again after each failure); it is exported for tools
// that read DiscardTopic themselves. A non-nil error means "try again
// later". Every decision comes from the txlog row: the message only gives
// the event id to look up, and the payload hash that tells whether it is
// the half that committed.
func (r *Recovery) Handle(ctx context.Context, m *primitive.MessageExt) (RecoveryResult, error) {
	return r.handle(ctx, m, 1, &attemptState{})
}

func (r *Recovery) handle(ctx context.Context, m *primitive.MessageExt, attempt int, st *attemptState) (res RecoveryResult, err error) {
	q := QueryFromMessage(m) // Topic is "" for a redelivered message
	res = RecoveryResult{EventID: q.EventID, Attempt: attempt, Redelivered: Redelivered(m)}
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("checkback: recovery panic for %s: %v", q.EventID, p)
		}
		res.Err = err
		r.report(res)
	}()
	if q.Group != r.cfg.Group || m.GetProperty(PropProbe) != "" {
		return res, nil
	}
	if q.EventID == "" {
		r.cfg.Logger.WithField("msg_id", m.MsgId).Warn("checkback: discarded half message without an rmqtx event id; left alone")
		return res, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout+r.cfg.SendTimeout)
	defer cancel()

	row, err := r.cfg.Log.Get(ctx, q.EventID)
	if errors.Is(err, txlog.ErrNotFound) {
		// Never ran, or still running: fence. The topic is informational
		// on a ROLLED_BACK row; it is recorded only when the broker's
		// REAL_TOPIC can be trusted (not after a retry).
		var fenced bool
		fr := txlog.Row{EventID: q.EventID, ProducerGroup: r.cfg.Group, Topic: q.Topic, Tags: q.Tags, Keys: q.Keys,
			EventType: q.EventType, BusinessKey: q.BusinessKey, PayloadHash: q.PayloadHash, ResolvedBy: txlog.ByRecovery}
		row, fenced, err = r.cfg.Log.Fence(ctx, fr)
		if err == nil && fenced {
			st.fenced = true
			metrics.Inc(r.cfg.Metrics, fencesVec, r.cfg.Group)
		}
	}
	if err != nil {
		return res, fmt.Errorf("checkback: recovery of %s: %w", q.EventID, err)
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
	// COMMITTED.
	if row.RecoveryDecision == txlog.RecoveryRepublished {
		return res, nil // a second discarded copy of the same transaction
	}
	if bodyHash := envelope.Hash(m.Body); (q.PayloadHash != "" && q.PayloadHash != bodyHash) || (row.PayloadHash != "" && row.PayloadHash != bodyHash) {
		// Not the half that committed (an event id reused with another
		// payload, whose local transaction failed on the duplicate key).
		res.Decision = txlog.RecoveryConflict
		err = r.mark(ctx, &res, "half payload hash "+bodyHash+" differs from the committed row")
		return res, err
	}
	if row.RecoveryDecision == txlog.RecoveryNoPayload {
		return res, nil // already decided and alerted
	}
	if st.republish == "" {
		msg, err := RepublishMessage(row)
		if errors.Is(err, ErrNotRepublishable) {
			res.Decision = txlog.RecoveryNoPayload
			err = r.mark(ctx, &res, notRepublishable(row))
			return res, err
		}
		if uk := m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex); uk != "" {
			// The transaction's message id, so consumers see the id of the
			// original send; an identifier only, never used to decide.
			msg.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, uk)
		}
		if r.pub == nil {
			return res, errors.New("checkback: recovery is not started (no publisher)")
		}
		sctx, scancel := context.WithTimeout(ctx, r.cfg.SendTimeout)
		defer scancel()
		sctx, sp := r.tr.StartFromMessage(sctx, msg, otelx.SpanRepublish, trace.SpanKindProducer, otelx.Attrs{Destination: row.Topic, Group: r.cfg.Group})
		r.tr.InjectMessage(sctx, msg)
		sr, err := r.pub.SendSync(sctx, msg)
		sp.EndSend(sr, err)
		if err != nil {
			return res, fmt.Errorf("checkback: republish %s: %w", q.EventID, err)
		}
		if sr.Status != primitive.SendOK {
			return res, fmt.Errorf("checkback: republish %s: broker status %d", q.EventID, sr.Status)
		}
		st.republish = sr.MsgID
		failpoint.Inject(failpoint.AfterRepublish)
	}
	res.Decision, res.MsgID = txlog.RecoveryRepublished, st.republish
	err = r.mark(ctx, &res, "republished as "+st.republish)
	return res, err
}

func fencesVec(m *metrics.Metrics) *prometheus.CounterVec { return m.CheckbackFences }

func (r *Recovery) mark(ctx context.Context, res *RecoveryResult, note string) error {
	res.note = note
	id, d := res.EventID, res.Decision
	if err := r.cfg.Log.MarkRecovered(ctx, id, d, note); err != nil {
		return fmt.Errorf("checkback: recovery of %s: record %s: %w", id, d, err)
	}
	return nil
}

func (r *Recovery) report(res RecoveryResult) {
	if res.Decision == "" && res.Err == nil {
		return
	}
	decision := strings.ToLower(string(res.Decision))
	l := r.cfg.Logger.WithFields(logrus.Fields{"event_id": res.EventID, "topic": res.Topic, "decision": res.Decision,
		"msg_id": res.MsgID, "attempt": res.Attempt, "redelivered": res.Redelivered})
	switch {
	case res.Err != nil:
		decision = "failed"
		l = l.WithError(res.Err)
		if res.Attempt == 1 || res.Attempt%20 == 0 {
			l.Warn("checkback: recovery attempt failed; retrying until decided")
		} else {
			l.Debug("checkback: recovery attempt failed; retrying until decided")
		}
	case res.Decision == txlog.RecoveryNoPayload:
		l.WithField("note", res.note).Error("checkback: a committed event the broker discarded cannot be republished from the txlog; it is NOT delivered: publish it by hand")
	case res.Decision == txlog.RecoveryConflict:
		l.WithField("note", res.note).Error("checkback: discarded half message does not match the committed row; dropped")
	default:
		l.Info("checkback: recovered a discarded half message")
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
		return fmt.Errorf("checkback: recovery shutdown: %w", ctx.Err())
	}
	var errs []error
	if r.pc != nil {
		if err := r.pc.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	if r.ownPub != nil {
		if err := r.ownPub.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("checkback: recovery shutdown: %w", err)
	}
	return nil
}

// Close is Shutdown bounded by shutdown.DefaultCloseTimeout (30 s), the
// bound every rmqtx Close shares.
func (r *Recovery) Close() error { return shutdown.Close(r.Shutdown) }
