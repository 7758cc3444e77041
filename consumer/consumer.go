package consumer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	rmq "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/internal/pushstop"
	"github.com/rmqtx/rmqtx/internal/remoting"
	"github.com/rmqtx/rmqtx/internal/rmqlog"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/internal/shutdown"
)

// Config configures a Consumer: the processing core plus the broker wiring.
type Config struct {
	ProcessorConfig

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
	Selector rmq.MessageSelector
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
	// Goroutines is the client's ConsumeGoroutineNums. Default 20.
	Goroutines int
	// FromLatest makes a new group start at the end of the topic. Default
	// false: a new group starts at the first offset, so no event published
	// before the group existed is missed.
	FromLatest bool
	// MaxReconsumeTimes is the broker's own limit before its %DLQ% topic. It
	// is a backstop: the default, max(MaxRetries, MaxWaits)+3, lets rmqtx
	// park the message in its table first.
	MaxReconsumeTimes int
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	c.ProcessorConfig = c.ProcessorConfig.WithDefaults()
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
	if err := c.ProcessorConfig.validate(); err != nil {
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
	pc      rocketmq.PushConsumer
	gate    *pushstop.Gate // makes pc's Shutdown safe on the upstream client
	prod    rocketmq.Producer
	resend  resender
	closing bool

	// wrapResend lets tests observe re-sends; set before Start.
	wrapResend func(resender) resender
}

// New validates cfg (after WithDefaults) and builds the consumer. It does
// not connect: Start does.
func New(cfg Config) (*Consumer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	proc, err := NewProcessor(cfg.ProcessorConfig)
	if err != nil {
		return nil, err
	}
	return &Consumer{cfg: cfg, proc: proc}, nil
}

// Processor returns the processing core (stats, dead letters).
func (c *Consumer) Processor() *Processor { return c.proc }

// Config returns the configuration with defaults applied.
func (c *Consumer) Config() Config { return c.cfg }

// Start subscribes and starts consuming. Calling it again while started is a
// no-op; after Shutdown it returns ErrClosed. The tables must exist
// (schema.MigrateAll).
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
	rmqlog.Install(c.cfg.Logger)
	ns := primitive.NewPassthroughResolver(c.cfg.NameServers)
	from := rmq.ConsumeFromFirstOffset
	if c.cfg.FromLatest {
		from = rmq.ConsumeFromLastOffset
	}
	gate := pushstop.New(c.cfg.Group, c.cfg.NameServers)
	pc, err := rocketmq.NewPushConsumer(
		rmq.WithGroupName(c.cfg.Group),
		rmq.WithNsResolver(ns),
		rmq.WithInstance(c.cfg.InstanceName),
		rmq.WithConsumerModel(rmq.Clustering),
		rmq.WithConsumeFromWhere(from),
		rmq.WithConsumeMessageBatchMaxSize(c.cfg.BatchSize),
		rmq.WithConsumeGoroutineNums(c.cfg.Goroutines),
		rmq.WithMaxReconsumeTimes(int32(c.cfg.MaxReconsumeTimes)),
		gate.Option(),
	)
	if err != nil {
		return fmt.Errorf("consumer: new push consumer: %w", err)
	}
	if err := pc.Subscribe(c.cfg.Topic, c.cfg.Selector, gate.Wrap(c.onMessages)); err != nil {
		return fmt.Errorf("consumer: subscribe %s: %w", c.cfg.Topic, err)
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
		p, err := rocketmq.NewProducer(
			producer.WithGroupName(group+"_rmqtx_resend"),
			producer.WithNsResolver(ns),
			producer.WithInstanceName(c.cfg.InstanceName+"-resend"),
			producer.WithRetry(2),
		)
		if err != nil {
			return fmt.Errorf("consumer: new resend producer: %w", err)
		}
		if err := p.Start(); err != nil {
			return fmt.Errorf("consumer: start resend producer: %w", err)
		}
		c.prod = p
		c.resend = &producerResender{p: p, retryTopic: "%RETRY%" + c.cfg.Group}
		if c.wrapResend != nil {
			c.resend = c.wrapResend(c.resend)
		}
	}
	if err := pc.Start(); err != nil {
		if c.prod != nil {
			_ = c.prod.Shutdown()
			c.prod, c.resend = nil, nil
		}
		return fmt.Errorf("consumer: start push consumer: %w", err)
	}
	c.pc, c.gate = pc, gate
	c.state = stateStarted
	return nil
}

// Shutdown stops consuming. It suspends pulling and drops what pulls still
// in flight bring (the queue's next owner gets those messages again), lets
// the messages being processed finish, hands the prefetched ones back to the
// broker for a redelivery in about a second, waits until the client has
// recorded every acknowledgement, and only then shuts the clients down, so
// that the upstream client's shutdown cannot panic (see internal/pushstop)
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
	pc, gate, prod := c.pc, c.gate, c.prod
	c.mu.Unlock()

	werr := gate.Stop(ctx, pc)
	err := pc.Shutdown()
	if prod != nil {
		if perr := prod.Shutdown(); err == nil {
			err = perr
		}
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

func (c *Consumer) onMessages(ctx context.Context, msgs ...*primitive.MessageExt) (rmq.ConsumeResult, error) {
	if !c.enter() {
		if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
			cc.DelayLevelWhenNextConsume = 1
		}
		return rmq.ConsumeRetryLater, nil
	}
	if c.cfg.BatchTransaction && len(msgs) > 1 {
		return consumeTxBatch(ctx, c.proc, c.resend, msgs)
	}
	return consumeBatch(ctx, c.proc.Process, c.resend, msgs)
}

// resender re-publishes one message to the group's retry topic with a delay.
type resender interface {
	Resend(ctx context.Context, m *primitive.MessageExt, delayLevel int) error
}

type processFunc func(context.Context, Message) Outcome

// consumeBatch gives every message its own transaction and outcome. The
// client only knows one result per batch (it ignores AckIndex), so:
//   - one message: RetryLater with the outcome's delay level, the native way;
//   - several: the ones to retry are re-sent to the retry topic one by one
//     and the batch is ACKed, so committed siblings are not delivered again;
//     if a re-send fails, the whole batch is handed back (siblings then come
//     back as dedup hits: their effect still never runs twice).
func consumeBatch(ctx context.Context, process processFunc, rs resender, msgs []*primitive.MessageExt) (rmq.ConsumeResult, error) {
	outs := make([]Outcome, len(msgs))
	for i, m := range msgs {
		outs[i] = process(ctx, MessageFromExt(m))
	}
	return settle(ctx, rs, msgs, outs)
}

// settle answers the client for msgs given their outcomes (see
// consumeBatch).
func settle(ctx context.Context, rs resender, msgs []*primitive.MessageExt, outs []Outcome) (rmq.ConsumeResult, error) {
	cc, _ := primitive.GetConcurrentlyCtx(ctx)
	setDelay := func(level int) {
		if cc != nil {
			cc.DelayLevelWhenNextConsume = level
		}
	}
	type retry struct {
		m     *primitive.MessageExt
		level int
	}
	var retries []retry
	for i, m := range msgs {
		if o := outs[i]; !o.Ack() {
			retries = append(retries, retry{m, max(o.DelayLevel, 1)})
		}
	}
	if len(retries) == 0 {
		return rmq.ConsumeSuccess, nil
	}
	if len(msgs) == 1 {
		setDelay(retries[0].level)
		return rmq.ConsumeRetryLater, nil
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
			return rmq.ConsumeSuccess, nil
		}
	}
	level := retries[0].level
	for _, r := range retries {
		level = min(level, r.level)
	}
	setDelay(level)
	return rmq.ConsumeRetryLater, nil
}

type producerResender struct {
	p          rocketmq.Producer
	retryTopic string
}

func (r *producerResender) Resend(ctx context.Context, m *primitive.MessageExt, delayLevel int) error {
	d := MessageFromExt(m)
	out := primitive.NewMessage(r.retryTopic, m.Body)
	out.WithProperties(replayProperties(m.GetProperties()))
	out.WithProperty(primitive.PropertyRetryTopic, d.Delivery.Topic)
	out.WithProperty(propReconsume, strconv.Itoa(d.Delivery.ReconsumeTimes+1))
	origin := m.GetProperty(primitive.PropertyOriginMessageId)
	if origin == "" {
		origin = m.MsgId
	}
	out.WithProperty(primitive.PropertyOriginMessageId, origin)
	out.WithDelayTimeLevel(delayLevel)
	res, err := r.p.SendSync(ctx, out)
	if err != nil {
		return fmt.Errorf("consumer: resend to %s: %w", r.retryTopic, err)
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("consumer: resend to %s: status %d", r.retryTopic, res.Status)
	}
	return nil
}

// ensureRetryTopic creates the group's retry topic (%RETRY%<group>, one
// queue) on the brokers of the subscribed topic before the client starts, as
// the broker itself does on a group's first retry. The client learns the
// route of a topic created later only on its periodic refresh (30 s), so a
// new group's first retries would otherwise wait that long. Best effort: a
// failure is logged and the broker's own creation remains the fallback.
func (c *Consumer) ensureRetryTopic(ctx context.Context) {
	retry := "%RETRY%" + c.cfg.Group
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := remoting.MasterBrokers(ctx, c.cfg.NameServers, 0, retry); err == nil {
		return
	}
	log := c.cfg.Logger.WithField("retry_topic", retry)
	brokers, err := remoting.MasterBrokers(ctx, c.cfg.NameServers, 0, c.cfg.Topic)
	if err != nil {
		log.WithError(err).Debug("consumer: retry topic not created: no route for the subscribed topic yet")
		return
	}
	for _, addr := range brokers {
		if err := remoting.CreateTopic(ctx, addr, 0, retry, 1); err != nil {
			log.WithError(err).Warn("consumer: could not create the retry topic; the first retries may wait for a route refresh")
		}
	}
}
