package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/internal/shutdown"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/rmqmsg"
)

// Config configures a Consumer: the processing core plus the broker wiring,
// all at one level, as in every other rmqtx Config:
//
//	consumer.Config{Group: "points", DB: db, Routes: routes,
//		Observe: observe.Observe{Logger: l}, NameServers: ns, Topic: "payments"}
type Config struct {
	// The processing fields mean what the fields of the same name in
	// ProcessorConfig mean, defaults and checks included; Processing
	// returns them as the ProcessorConfig the Consumer's Processor gets.

	Group              string                         // the consumer group, the dedup scope. Required.
	DB                 *sqlx.DB                       // the consume log and the business tables. Required.
	TablePrefix        string                         // of the consumer tables. Default DefaultPrefix.
	Routes             map[string]Route               // event type -> Route. At least one is required.
	UnknownType        UnknownTypePolicy              // types without a Route. Default UnknownPark.
	Adopt              *Adoption                      // messages without rmqtx's envelope. Default nil: parked.
	VersionMode        VersionMode                    // the aggregate-version guard. Default VersionStrict.
	StrictFirstVersion int64                          // first version strict mode expects. Default 1.
	MaxRetries         int                            // transient and unknown failures before parking. Default 10.
	MaxWaits           int                            // Wait failures before parking. Default 20.
	NoCrashCount       bool                           // no attempt counted before each handler run (see ProcessorConfig).
	DelayLevel         func(c Class, attempt int) int // redelivery delay. Default DefaultDelayLevel.
	ProcessTimeout     time.Duration                  // one message's transaction. Default 30s.
	DedupCacheSize     int                            // committed-id cache entries. Default DefaultDedupCacheSize.
	Redact             func(payload []byte) []byte    // what a dead letter stores. Default RedactPayload.
	RedactText         func(string) string            // applied to logged and stored error texts.
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), the same in every rmqtx component: the zero value logs,
	// counts and traces nothing.
	observe.Observe

	// NameServers lists the name server addresses (host:port). Required;
	// the client's default HTTP resolver is never used.
	NameServers []string
	// InstanceName identifies this client in the process. Default
	// "rmqtx-consumer-<group>-<pid>-<random>", unique per Consumer: clients
	// are shared per instance name, and a shared client would mix groups.
	InstanceName string
	// Topic to subscribe to. Required.
	Topic string
	// Selector filters by tag or SQL92; default all messages.
	Selector rmqmsg.MessageSelector
	// BatchSize is the client's ConsumeMessageBatchMaxSize: the most
	// messages of one queue handed over at once. Default 1, or
	// DefaultBatchTxSize (16) with BatchTransaction. Above 1 each message
	// still gets its own outcome (and, without BatchTransaction, its own
	// transaction). The client only takes one answer per batch, so the
	// messages to retry are re-sent one by one, with their delay level, to
	// the group's retry topic, and the batch is ACKed: committed siblings
	// are not delivered again. Only if a re-send fails is the whole batch
	// handed back; its committed messages then come back as dedup hits.
	BatchSize int
	// BatchTransaction (opt-in) makes the messages handed over at once share
	// one database transaction: one multi-row dedup insert, each handler in
	// its own SAVEPOINT (a failing event rolls back alone), one COMMIT, then
	// the ACK (see Processor.ProcessBatch). Default false: one transaction
	// per message.
	BatchTransaction bool
	// Goroutines is the client's ConsumeGoroutineNums, and the number of
	// worker goroutines the deliveries run on (workers.go). Default 20.
	Goroutines int
	// FromLatest makes a new group start at the end of the topic. Default
	// false: a new group starts at the first offset, so no event published
	// before the group existed is missed.
	FromLatest bool
	// MaxReconsumeTimes is the broker's own limit before its %DLQ% topic. It
	// is a backstop: the default, max(MaxRetries, MaxWaits)+3, lets rmqtx
	// park the message in its table first.
	MaxReconsumeTimes int

	// ProcessorConfig is the earlier spelling of the processing fields,
	// kept so that code written as Config{ProcessorConfig: ...} compiles.
	// WithDefaults copies it into them when they are all unset; setting
	// both is an ErrConfig.
	//
	// Deprecated: set the processing fields of Config directly.
	ProcessorConfig ProcessorConfig
}

// Processing returns the processing fields of c as a ProcessorConfig: what
// NewProcessor takes, for a Processor driven without the push consumer.
func (c Config) Processing() ProcessorConfig {
	return ProcessorConfig{
		Group: c.Group, DB: c.DB, TablePrefix: c.TablePrefix, Routes: c.Routes,
		UnknownType: c.UnknownType, Adopt: c.Adopt, VersionMode: c.VersionMode,
		StrictFirstVersion: c.StrictFirstVersion, MaxRetries: c.MaxRetries, MaxWaits: c.MaxWaits, NoCrashCount: c.NoCrashCount,
		DelayLevel: c.DelayLevel, ProcessTimeout: c.ProcessTimeout, DedupCacheSize: c.DedupCacheSize,
		Redact: c.Redact, RedactText: c.RedactText, Observe: c.Observe,
	}
}

// setProcessing sets the processing fields of c from p (Processing's inverse).
func (c *Config) setProcessing(p ProcessorConfig) {
	c.Group, c.DB, c.TablePrefix, c.Routes = p.Group, p.DB, p.TablePrefix, p.Routes
	c.UnknownType, c.Adopt, c.VersionMode = p.UnknownType, p.Adopt, p.VersionMode
	c.StrictFirstVersion, c.MaxRetries, c.MaxWaits = p.StrictFirstVersion, p.MaxRetries, p.MaxWaits
	c.NoCrashCount = p.NoCrashCount
	c.DelayLevel, c.ProcessTimeout, c.DedupCacheSize = p.DelayLevel, p.ProcessTimeout, p.DedupCacheSize
	c.Redact, c.RedactText, c.Observe = p.Redact, p.RedactText, p.Observe
}

// isZero reports whether p sets nothing. Reflection, not a field list: a
// field added to ProcessorConfig later is covered without an edit here.
func (p ProcessorConfig) isZero() bool { return reflect.ValueOf(p).IsZero() }

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if !c.ProcessorConfig.isZero() && c.Processing().isZero() {
		c.setProcessing(c.ProcessorConfig)
		c.ProcessorConfig = ProcessorConfig{}
	}
	c.setProcessing(c.Processing().WithDefaults())
	if c.InstanceName == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		c.InstanceName = fmt.Sprintf("rmqtx-consumer-%s-%d-%s", c.Group, os.Getpid(), hex.EncodeToString(b))
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1
		if c.BatchTransaction {
			c.BatchSize = DefaultBatchTxSize
		}
	}
	if c.Goroutines <= 0 {
		c.Goroutines = 20
	}
	if c.MaxReconsumeTimes <= 0 {
		c.MaxReconsumeTimes = max(c.MaxRetries, c.MaxWaits) + 3
	}
	return c
}

func (c Config) validate() error {
	if !c.ProcessorConfig.isZero() {
		return fmt.Errorf("%w: ProcessorConfig (deprecated) and the processing fields of Config are both set; set the fields of Config only", ErrConfig)
	}
	if err := c.Processing().validate(); err != nil {
		return err
	}
	if err := rmqname.NameServers(c.NameServers); err != nil {
		return fmt.Errorf("%w: NameServers %w", ErrConfig, err)
	}
	if c.Topic == "" {
		return fmt.Errorf("%w: Topic is required", ErrConfig)
	}
	if err := rmqname.Topic(c.Topic); err != nil {
		return fmt.Errorf("%w: Topic %w", ErrConfig, err)
	}
	if c.BatchSize > 1024 {
		return fmt.Errorf("%w: BatchSize %d is more than 1024", ErrConfig, c.BatchSize)
	}
	return nil
}

type lifecycle int

const (
	stateNew lifecycle = iota
	stateStarted
	stateClosed
)

// Consumer wires a Processor into a rocketmq-client-go push consumer
// (clustering, concurrent). Create it with New, then Start; stop it with
// Shutdown or Close. A Consumer cannot be restarted: create a new one (it
// gets a new instance name).
type Consumer struct {
	cfg  Config
	proc *Processor

	mu      sync.Mutex
	state   lifecycle
	pc      broker.PushConsumer // behind the seam's stop gate (internal/broker/pushstop)
	seq     *sequencer          // keeps the order per routing key (serialize.go)
	prod    broker.Producer
	resend  resender
	closing bool
	watch   *topicWatch // waits for a topic missing at Start (topicwait.go)
	work    *workers    // runs deliveries on grown stacks (workers.go)

	// wrapResend lets tests observe re-sends; set before Start.
	wrapResend func(resender) resender
	// wrapDeliver, when set, runs first in every delivery (tests).
	wrapDeliver func()
}

// New validates cfg (after WithDefaults) and builds the consumer. It does
// not connect: Start does.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	proc, err := NewProcessor(cfg.Processing())
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, proc: proc}, nil
}

// Processor returns the processing core (stats, dead letters).
func (c *Consumer) Processor() *Processor { return c.proc }

// Config returns the configuration with defaults applied.
func (c *Consumer) Config() Config { return c.cfg }

// Start checks that the database answers a ping and a name server answers
// a request (an error names the address and the cause and wraps
// ErrDatabaseUnreachable or ErrNameServerUnreachable), then subscribes and
// starts consuming. Calling it again while started is a no-op; after
// Shutdown it returns ErrClosed. The tables must exist (schema.MigrateAll).
//
// The topic need not exist yet: Start then succeeds, logs once at Warn
// that the topic does not exist (again every 5 minutes while it does not),
// and consumes within seconds of its creation (see topicwait.go).
func (c *Consumer) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.state {
	case stateStarted:
		return nil
	case stateClosed:
		return ErrClosed
	}
	if err := c.checkReachable(ctx); err != nil {
		return err
	}
	rmqlog.Install(c.cfg.Logger)
	from := broker.ConsumeFromFirstOffset
	if c.cfg.FromLatest {
		from = broker.ConsumeFromLastOffset
	}
	seq := newSequencer()
	pc, err := broker.NewPushConsumer(broker.PushConsumerConfig{
		Group:             c.cfg.Group,
		NameServers:       c.cfg.NameServers,
		InstanceName:      c.cfg.InstanceName,
		FromWhere:         from,
		BatchSize:         c.cfg.BatchSize,
		Goroutines:        c.cfg.Goroutines,
		MaxReconsumeTimes: int32(c.cfg.MaxReconsumeTimes),
		// What the seam's stop gate lets through is registered in pull
		// order.
		OnPulled: seq.register,
	})
	if err != nil {
		return fmt.Errorf("consumer: new push consumer: %w", err)
	}
	c.seq = seq // onMessages reads it; set before the first delivery
	// The client's Start fails on a subscribed topic the name server does
	// not know: a missing topic is subscribed once the client started.
	missing := c.topicMissing(ctx)
	subscribe := func() error {
		if err := pc.Subscribe(c.cfg.Topic, c.cfg.Selector, c.onMessages); err != nil {
			return fmt.Errorf("consumer: subscribe %s: %w", c.cfg.Topic, err)
		}
		return nil
	}
	if !missing {
		if err := subscribe(); err != nil {
			return err
		}
	}
	c.ensureRetryTopic(ctx)
	if err := c.proc.loadFailed(ctx); err != nil {
		c.cfg.Logger.WithError(err).WithField("consumer_group", c.cfg.Group).
			Warn("consumer: cannot read earlier failed attempts; their rows are cleared by their retries")
	}
	if c.cfg.BatchSize > 1 {
		group := c.cfg.Group
		if len(group) > 200 {
			group = group[:200]
		}
		p, err := broker.NewProducer(broker.ProducerConfig{
			NameServers:  c.cfg.NameServers,
			Group:        group + "_rmqtx_resend",
			InstanceName: c.cfg.InstanceName + "-resend",
			Retries:      2,
		})
		if err != nil {
			return fmt.Errorf("consumer: new resend producer: %w", err)
		}
		if err := p.Start(); err != nil {
			return fmt.Errorf("consumer: start resend producer: %w", err)
		}
		c.prod = p
		c.resend = &producerResender{p: p, retryTopic: broker.RetryTopic(c.cfg.Group)}
		if c.wrapResend != nil {
			c.resend = c.wrapResend(c.resend)
		}
	}
	c.work = startWorkers(c.cfg.Goroutines) // onMessages reads it: before the client starts
	if err := pc.Start(); err != nil {
		c.work.shutdown(true)
		if c.prod != nil {
			_ = c.prod.Shutdown()
			c.prod, c.resend = nil, nil
		}
		return fmt.Errorf("consumer: start push consumer: %w", err)
	}
	if missing {
		if err := subscribe(); err != nil {
			_ = pc.Shutdown()
			c.work.shutdown(true)
			if c.prod != nil {
				_ = c.prod.Shutdown()
				c.prod, c.resend = nil, nil
			}
			return err
		}
		c.watch = c.watchTopic(pc)
	}
	c.pc, c.seq = pc, seq
	c.state = stateStarted
	return nil
}

// Shutdown stops consuming. It suspends pulling and drops what pulls still
// in flight bring (the queue's next owner gets those messages again), lets
// the messages being processed finish, hands the prefetched ones back to the
// broker for a redelivery in about a second, waits until the client has
// recorded every acknowledgement, and only then shuts the clients down, so
// that the upstream client's shutdown cannot panic (see internal/broker/pushstop)
// and no acknowledgement is lost. It is idempotent; it returns an error
// wrapping ctx.Err() if that work outlived ctx (the clients are shut down
// anyway; the unfinished transactions roll back).
func (c *Consumer) Shutdown(ctx context.Context) error {
	c.mu.Lock()
	if c.state != stateStarted {
		c.state = stateClosed
		c.mu.Unlock()
		return nil
	}
	c.state = stateClosed
	c.closing = true
	pc, prod, watch := c.pc, c.prod, c.watch
	c.mu.Unlock()
	watch.stop()     // before the client stops: the watcher may call it
	c.seq.shutdown() // waiters hand their events back instead of waiting

	// Close, not Stop then Shutdown: it writes the offsets again once the
	// client is shut down, after any older offset a pull of the client's
	// carried to the broker (internal/broker/pushstop).
	werr := pc.Close(ctx)
	// Without an error no callback runs any more: the workers are idle.
	c.work.shutdown(werr == nil)
	if r, ok := pc.(interface{ Reacquired() int64 }); ok && r.Reacquired() > 0 {
		c.cfg.Logger.WithField("consumer_group", c.cfg.Group).WithField("queues", r.Reacquired()).
			Info("consumer: shutdown: queues given back by a rebalance just before it hold an offset below messages this consumer acknowledged; those messages are delivered again (dedup hits)")
	}
	var err error
	if prod != nil {
		err = prod.Shutdown()
	}
	if werr != nil {
		return fmt.Errorf("consumer: shutdown: %w", werr)
	}
	if err != nil {
		return fmt.Errorf("consumer: shutdown: %w", err)
	}
	return nil
}

// Close is Shutdown bounded by shutdown.DefaultCloseTimeout (30 s), the
// bound every rmqtx Close shares: handlers still running then roll back.
func (c *Consumer) Close() error { return shutdown.Close(c.Shutdown) }

// enter reports whether a delivery may be processed: not once Shutdown has
// begun (the gate counts the callbacks in progress and waits for them).
func (c *Consumer) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closing
}

func (c *Consumer) onMessages(ctx context.Context, msgs ...*broker.MessageExt) (broker.ConsumeResult, error) {
	return c.work.deliver(ctx, c, msgs)
}

// deliver is a delivery's work (onMessages runs it on a worker).
func (c *Consumer) deliver(ctx context.Context, msgs []*broker.MessageExt) (broker.ConsumeResult, error) {
	if c.wrapDeliver != nil {
		c.wrapDeliver()
	}
	if !c.enter() {
		broker.SetNextDelayLevel(ctx, 1)
		return broker.ConsumeRetryLater, nil
	}
	// The events of one routing key apply in the order they were pulled
	// (serialize.go).
	if c.cfg.BatchTransaction && len(msgs) > 1 {
		return consumeTxBatchOrdered(ctx, c.seq, c.proc, c.resend, msgs)
	}
	return consumeOrdered(ctx, c.seq, c.proc.Process, c.resend, msgs)
}

// resender re-publishes one message to the group's retry topic with a delay.
type resender interface {
	Resend(ctx context.Context, m *broker.MessageExt, delayLevel int) error
}

type processFunc func(context.Context, Message) Outcome

// consumeBatch gives every message its own transaction and outcome. The
// client only knows one result per batch (it ignores AckIndex), so:
//   - one message: RetryLater with the outcome's delay level, the native way;
//   - several: the ones to retry are re-sent to the retry topic one by one
//     and the batch is ACKed, so committed siblings are not delivered again;
//     if a re-send fails, the whole batch is handed back (siblings then come
//     back as dedup hits: their effect still never runs twice).
func consumeBatch(ctx context.Context, process processFunc, rs resender, msgs []*broker.MessageExt) (broker.ConsumeResult, error) {
	outs := make([]Outcome, len(msgs))
	for i, m := range msgs {
		outs[i] = process(ctx, MessageFromExt(m))
	}
	return settle(ctx, rs, msgs, outs)
}

// settle answers the client for msgs given their outcomes (see
// consumeBatch).
func settle(ctx context.Context, rs resender, msgs []*broker.MessageExt, outs []Outcome) (broker.ConsumeResult, error) {
	setDelay := func(level int) { broker.SetNextDelayLevel(ctx, level) }
	type retry struct {
		m     *broker.MessageExt
		level int
	}
	var retries []retry
	for i, m := range msgs {
		if o := outs[i]; !o.Ack() {
			retries = append(retries, retry{m, max(o.DelayLevel, 1)})
		}
	}
	if len(retries) == 0 {
		return broker.ConsumeSuccess, nil
	}
	if len(msgs) == 1 {
		setDelay(retries[0].level)
		return broker.ConsumeRetryLater, nil
	}
	if rs != nil {
		ok := true
		for _, r := range retries {
			if err := rs.Resend(ctx, r.m, r.level); err != nil {
				ok = false
				break
			}
		}
		if ok {
			return broker.ConsumeSuccess, nil
		}
	}
	level := retries[0].level
	for _, r := range retries {
		level = min(level, r.level)
	}
	setDelay(level)
	return broker.ConsumeRetryLater, nil
}

type producerResender struct {
	p          broker.Producer
	retryTopic string
}

func (r *producerResender) Resend(ctx context.Context, m *broker.MessageExt, delayLevel int) error {
	d := MessageFromExt(m)
	out := broker.NewMessage(r.retryTopic, m.Body)
	out.WithProperties(replayProperties(m.GetProperties()))
	out.WithProperty(broker.PropRetryTopic, d.Delivery.Topic)
	out.WithProperty(propReconsume, strconv.Itoa(d.Delivery.ReconsumeTimes+1))
	origin := m.GetProperty(broker.PropOriginMessageID)
	if origin == "" {
		origin = m.MsgId
	}
	out.WithProperty(broker.PropOriginMessageID, origin)
	out.WithDelayTimeLevel(delayLevel)
	res, err := r.p.SendSync(ctx, out)
	if err != nil {
		return fmt.Errorf("consumer: resend to %s: %w", r.retryTopic, err)
	}
	if err := broker.CheckSendResult(res); err != nil {
		return fmt.Errorf("consumer: resend to %s: %w", r.retryTopic, err)
	}
	return nil
}

// ensureRetryTopic creates the group's retry topic (%RETRY%<group>, one
// queue) on the brokers of the subscribed topic before the client starts
// (broker.EnsureRetryTopic: a new group's first retries would otherwise
// wait for the client's route refresh, 30 s). Best effort: a failure is
// logged and the broker's own creation remains the fallback.
func (c *Consumer) ensureRetryTopic(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err := broker.EnsureRetryTopic(ctx, broker.RetryTopicSpec{NameServers: c.cfg.NameServers, Group: c.cfg.Group, Topic: c.cfg.Topic})
	if err == nil {
		return
	}
	log := c.cfg.Logger.WithField("retry_topic", broker.RetryTopic(c.cfg.Group)).WithError(err)
	if errors.Is(err, broker.ErrNoBrokers) {
		log.Debug("consumer: retry topic not created: no route for the subscribed topic yet")
		return
	}
	log.Warn("consumer: could not create the retry topic; the first retries may wait for a route refresh")
}
