package checkback

import (
	"context"
	"errors"
	"fmt"
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

	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/internal/rmqlog"
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
	DefaultStartRetry  = 30 * time.Second
	DefaultSendTimeout = 3 * time.Second
)

// stripped are the properties of a discarded half message that must not be
// carried onto the republished message: transaction markers, broker
// bookkeeping and retry bookkeeping. KEYS, TAGS, UNIQ_KEY and all rmqtx
// envelope properties are kept, so the event id (and the message id a
// consumer sees) is the one of the original transaction.
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
	// NameServer lists name server addresses (host:port). Required.
	NameServer []string
	// Group is the producer group whose discarded half messages are
	// recovered (the PGROUP property). Required.
	Group string
	// Log is the transaction log. Required.
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
	// StartRetry is how often to retry subscribing while DiscardTopic does
	// not exist yet (the broker creates it on the first discard). Default
	// DefaultStartRetry (30 s).
	StartRetry time.Duration
	// SendTimeout bounds one republish. Default DefaultSendTimeout (3 s).
	SendTimeout time.Duration
	// QueryTimeout bounds the txlog queries for one message. Default
	// DefaultQueryTimeout (3 s).
	QueryTimeout time.Duration
	// Metrics records DiscardRecoveries. Default nil.
	Metrics *metrics.Metrics
	// Logger receives one line per decision. Default quiet.
	Logger logrus.FieldLogger
	// OnDecision, when set, is called after each handled message. Default none.
	OnDecision func(RecoveryResult)
	// Publisher overrides the republish producer (tests). Default: a
	// producer created and owned by the Recovery.
	Publisher Publisher
}

// WithDefaults returns a copy of c with defaults filled in.
func (c RecoveryConfig) WithDefaults() RecoveryConfig {
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
	c.Logger = rmqlog.OrQuiet(c.Logger)
	return c
}

func (c RecoveryConfig) validate() error {
	switch {
	case len(c.NameServer) == 0:
		return fmt.Errorf("%w: NameServer is required", ErrConfig)
	case c.Group == "":
		return fmt.Errorf("%w: Group is required", ErrConfig)
	case c.Log == nil:
		return fmt.Errorf("%w: Log is required", ErrConfig)
	}
	return nil
}

// RecoveryResult reports what recovery did with one discarded message.
type RecoveryResult struct {
	EventID  string
	Topic    string                 // the real topic
	Decision txlog.RecoveryDecision // empty: not ours (other group, probe) or already handled
	MsgID    string                 // republished message id
	Err      error
}

var errStopped = errors.New("checkback: recovery stopped")

// Recovery consumes DiscardTopic for one producer group.
type Recovery struct {
	cfg RecoveryConfig

	mu       sync.Mutex
	started  bool
	closed   bool
	pub      Publisher
	ownPub   rocketmq.Producer
	pc       rocketmq.PushConsumer
	attempt  int
	stop     chan struct{}
	loopDone chan struct{}
	running  chan struct{} // closed once subscribed
}

// NewRecovery validates cfg and returns a Recovery that is not started.
func NewRecovery(cfg RecoveryConfig) (*Recovery, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Recovery{cfg: cfg, pub: cfg.Publisher, stop: make(chan struct{}), loopDone: make(chan struct{}), running: make(chan struct{})}, nil
}

// Start starts the republish producer and subscribes to DiscardTopic. If
// the topic does not exist yet it keeps retrying every StartRetry in the
// background; Running reports when the subscription is live.
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
			producer.WithNsResolver(primitive.NewPassthroughResolver(r.cfg.NameServer)),
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
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errStopped
	}
	r.attempt++
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithGroupName(r.cfg.ConsumerGroup),
		consumer.WithInstance(fmt.Sprintf("%s-%d", r.cfg.InstanceName, r.attempt)),
		consumer.WithNsResolver(primitive.NewPassthroughResolver(r.cfg.NameServer)),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumeMessageBatchMaxSize(1),
	)
	if err != nil {
		return fmt.Errorf("checkback: recovery consumer: %w", err)
	}
	err = pc.Subscribe(DiscardTopic, consumer.MessageSelector{}, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			if _, err := r.Handle(ctx, m); err != nil {
				return consumer.ConsumeRetryLater, nil
			}
		}
		return consumer.ConsumeSuccess, nil
	})
	if err != nil {
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

// Handle decides one discarded half message. It is what the subscription
// calls; it is exported for tools that read DiscardTopic themselves. A
// non-nil error means "try again later" (the message is redelivered).
func (r *Recovery) Handle(ctx context.Context, m *primitive.MessageExt) (res RecoveryResult, err error) {
	q := QueryFromMessage(m)
	res = RecoveryResult{EventID: q.EventID, Topic: q.Topic}
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
		var fenced bool
		fr := txlog.Row{EventID: q.EventID, ProducerGroup: r.cfg.Group, Topic: q.Topic, Tags: q.Tags, Keys: q.Keys,
			EventType: q.EventType, BusinessKey: q.BusinessKey, PayloadHash: q.PayloadHash, ResolvedBy: txlog.ByRecovery}
		row, fenced, err = r.cfg.Log.Fence(ctx, fr)
		if err == nil && fenced {
			metrics.Inc(r.cfg.Metrics, fencesVec, r.cfg.Group)
			res.Decision = txlog.RecoveryFenced
			return res, r.mark(ctx, q.EventID, res.Decision, "discarded by the broker with no txlog row")
		}
	}
	if err != nil {
		return res, err
	}
	if row.State == txlog.StateRolledBack {
		if row.RecoveredAt.IsZero() {
			res.Decision = txlog.RecoveryDropped
			return res, r.mark(ctx, q.EventID, res.Decision, "rolled back")
		}
		return res, nil
	}
	// COMMITTED.
	bodyHash := envelope.Hash(m.Body)
	if (q.PayloadHash != "" && q.PayloadHash != bodyHash) || (row.PayloadHash != "" && row.PayloadHash != bodyHash) {
		res.Decision = txlog.RecoveryConflict
		r.cfg.Logger.WithFields(logrus.Fields{"event_id": q.EventID, "row_hash": row.PayloadHash, "half_hash": bodyHash}).
			Error("checkback: discarded half message does not match the committed row; dropped")
		if row.RecoveryDecision == txlog.RecoveryRepublished {
			return res, nil
		}
		return res, r.mark(ctx, q.EventID, res.Decision, "half payload hash "+bodyHash+" differs from the committed row")
	}
	if row.RecoveryDecision == txlog.RecoveryRepublished {
		return res, nil // a second discarded copy of the same transaction
	}
	if r.pub == nil {
		return res, errors.New("checkback: recovery is not started (no publisher)")
	}
	msg := primitive.NewMessage(q.Topic, m.Body)
	msg.WithProperties(RepublishProperties(m.GetProperties()))
	sctx, scancel := context.WithTimeout(ctx, r.cfg.SendTimeout)
	defer scancel()
	sr, err := r.pub.SendSync(sctx, msg)
	if err != nil {
		return res, fmt.Errorf("checkback: republish %s: %w", q.EventID, err)
	}
	if sr.Status != primitive.SendOK {
		return res, fmt.Errorf("checkback: republish %s: broker status %d", q.EventID, sr.Status)
	}
	res.Decision, res.MsgID = txlog.RecoveryRepublished, sr.MsgID
	return res, r.mark(ctx, q.EventID, res.Decision, "republished as "+sr.MsgID)
}

func fencesVec(m *metrics.Metrics) *prometheus.CounterVec { return m.CheckbackFences }

func (r *Recovery) mark(ctx context.Context, id string, d txlog.RecoveryDecision, note string) error {
	if err := r.cfg.Log.MarkRecovered(ctx, id, d, note); err != nil {
		return err
	}
	return nil
}

func (r *Recovery) report(res RecoveryResult) {
	if res.Decision == "" && res.Err == nil {
		return
	}
	decision := strings.ToLower(string(res.Decision))
	l := r.cfg.Logger.WithFields(logrus.Fields{"event_id": res.EventID, "topic": res.Topic, "decision": res.Decision, "msg_id": res.MsgID})
	if res.Err != nil {
		decision = "failed"
		l.WithError(res.Err).Warn("checkback: recovery failed; will retry")
	} else {
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

// Shutdown stops the subscription and the republish producer. It is
// idempotent.
func (r *Recovery) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	started := r.started
	close(r.stop)
	r.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-r.loopDone:
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

// Close is Shutdown without a deadline.
func (r *Recovery) Close() error { return r.Shutdown(context.Background()) }
