package broker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/hooks"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/internal/broker/pushstop"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// ConsumeFunc is a push consumer's subscription callback: the messages of
// one delivery and the answer for all of them.
type ConsumeFunc = func(context.Context, ...*MessageExt) (ConsumeResult, error)

// PushConsumerConfig is what NewPushConsumer builds a push consumer
// (clustering, concurrent) from.
type PushConsumerConfig struct {
	Group        string
	NameServers  []string
	InstanceName string
	FromWhere    ConsumeFromWhere
	// BatchSize is the most messages one callback gets.
	BatchSize int
	// Goroutines is the client's consume goroutines; zero or less: the
	// client's default (20).
	Goroutines int
	// MaxReconsumeTimes is the broker's retry limit before the group's
	// %DLQ% topic (always passed on).
	MaxReconsumeTimes int32
	// ConsumeTimeout is how long a delivered message may stay unanswered
	// before the client hands it back; zero or less: the client's default
	// (15 min).
	ConsumeTimeout time.Duration
	// OnPulled, when set, sees each pull result the stop gate lets
	// through, on the pull goroutine, in pull order and before the client
	// queues it for delivery. It must not block.
	OnPulled func(mq MessageQueue, msgs []*MessageExt)
	// MasterWatch is how often the consumer asks the name server for the
	// cluster's masters, to read its routes and rebalance at once when they
	// change (a promoted slave, a restarted broker) instead of at the
	// client's 30 s route refresh; it also learns of a master's death from
	// an idle connection it holds to each, and then asks every 500 ms
	// (masterWatch). Zero: 2 s. Negative: no watch.
	MasterWatch time.Duration
}

// PushConsumer is the push consumer owners see. Its callbacks run behind a
// stop gate (package broker/pushstop), so that shutting it down cannot
// reach the upstream client's panic and loses no acknowledgement: stop it
// with Stop then Shutdown, or Close.
type PushConsumer interface {
	// Subscribe subscribes f to topic; before Start, or after it for a
	// topic the name server did not know then.
	Subscribe(topic string, selector MessageSelector, f ConsumeFunc) error
	Start() error
	// Stop suspends pulling, drops what pulls in flight bring, and waits,
	// bounded by ctx, until every delivered message's outcome is recorded;
	// then it writes the offsets to the brokers (pushstop.Gate.Stop). It
	// does not shut the client down.
	Stop(ctx context.Context) error
	// Shutdown shuts the client down; call Stop first (or use Close). On a
	// consumer never started it does nothing.
	Shutdown() error
	// Close is Stop then Shutdown, then it writes the offsets once more:
	// a pull the client built before Stop can carry an older offset to the
	// broker after Stop's write (pushstop.Gate.Shutdown). Stop a consumer
	// with Close, not Stop and Shutdown, to lose no acknowledgement. The
	// client is shut down even when ctx ends first, and the error then
	// wraps ctx's.
	Close(ctx context.Context) error
	// Discarded is how many pulled messages the closed gate dropped (they
	// are redelivered to the queue's next owner).
	Discarded() int64
	// RefreshNow makes the client read its routes, heartbeat its brokers
	// and rebalance now, as Start does, instead of on its own timers (30 s,
	// 20 s): for a subscription to a topic created after Start. It does
	// nothing on a client whose layout the seam does not know.
	RefreshNow()
}

// NewPushConsumer builds a push consumer that is not started.
func NewPushConsumer(cfg PushConsumerConfig) (PushConsumer, error) {
	// The gate's filter hook, then OnPulled: what the gate lets through is
	// seen in pull order.
	gate := pushstop.New(cfg.Group, cfg.NameServers)
	hook := gate.Hook
	if on := cfg.OnPulled; on != nil {
		hook = func(fc *hooks.FilterMessageContext) ([]*primitive.MessageExt, error) {
			msgs, err := gate.Hook(fc)
			if err == nil && fc.MQ != nil {
				on(*fc.MQ, msgs)
			}
			return msgs, err
		}
	}
	opts := []consumer.Option{
		consumer.WithGroupName(cfg.Group),
		consumer.WithNsResolver(NameServers(cfg.NameServers)),
		consumer.WithInstance(cfg.InstanceName),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(cfg.FromWhere),
		consumer.WithConsumeMessageBatchMaxSize(cfg.BatchSize),
		consumer.WithMaxReconsumeTimes(cfg.MaxReconsumeTimes),
	}
	if cfg.Goroutines > 0 {
		opts = append(opts, consumer.WithConsumeGoroutineNums(cfg.Goroutines))
	}
	if cfg.ConsumeTimeout > 0 {
		opts = append(opts, consumer.WithConsumeTimeout(cfg.ConsumeTimeout))
	}
	// WithFilterMessageHook replaces the hook list: the gate's goes last.
	opts = append(opts, consumer.WithFilterMessageHook([]hooks.FilterMessageHook{hook}))
	pc, err := rocketmq.NewPushConsumer(opts...)
	if err != nil {
		return nil, err
	}
	every := cfg.MasterWatch
	if every == 0 {
		every = masterPoll
	}
	return &pushConsumer{pc: pc, gate: gate, ns: cfg.NameServers, every: every}, nil
}

// pushConsumer is the client's PushConsumer behind its stop gate.
type pushConsumer struct {
	pc      rocketmq.PushConsumer
	gate    *pushstop.Gate
	started atomic.Bool // Start was called
	ns      []string
	every   time.Duration // masterWatch's poll; negative: no watch

	watchMu sync.Mutex
	watch   *masterWatch // running from Start to Stop, Shutdown or Close
}

// startWatch starts the master watch (see masterWatch) unless disabled.
func (p *pushConsumer) startWatch() {
	if p.every < 0 {
		return
	}
	p.watchMu.Lock()
	defer p.watchMu.Unlock()
	if p.watch == nil {
		p.watch = watchMasters(p.ns, p.every, func() { refreshNow(p.pc) })
	}
}

// stopWatch stops the master watch before the client stops.
func (p *pushConsumer) stopWatch() {
	p.watchMu.Lock()
	w := p.watch
	p.watch = nil
	p.watchMu.Unlock()
	w.stop()
}

func (p *pushConsumer) Subscribe(topic string, selector MessageSelector, f ConsumeFunc) error {
	return p.pc.Subscribe(topic, selector, p.gate.Wrap(f))
}

func (p *pushConsumer) Start() error {
	p.started.Store(true)
	if err := p.pc.Start(); err != nil {
		return err
	}
	p.startWatch()
	return nil
}

// Shutdown leaves a consumer that was never started alone. Upstream
// workaround (no upstream issue found): the client's Shutdown stops the
// statistics that only its Start creates, a nil dereference, and a panic,
// on a push consumer never started.
func (p *pushConsumer) Shutdown() error {
	if !p.started.Load() {
		return nil
	}
	p.stopWatch()
	return p.pc.Shutdown()
}

func (p *pushConsumer) Stop(ctx context.Context) error {
	p.stopWatch()
	return p.gate.Stop(ctx, p.pc)
}
func (p *pushConsumer) Close(ctx context.Context) error {
	if !p.started.Load() {
		return nil // see Shutdown
	}
	p.stopWatch()
	return p.gate.Shutdown(ctx, p.pc)
}
func (p *pushConsumer) Discarded() int64 { return p.gate.Discarded() }
func (p *pushConsumer) RefreshNow()      { refreshNow(p.pc) }

// Reacquired is how many queues Close stopped waiting for as given back by
// a rebalance just before it (pushstop.Gate.Reacquired): their messages
// above the offset the client held are delivered again.
func (p *pushConsumer) Reacquired() int64 { return p.gate.Reacquired() }

// SetNextDelayLevel sets the delay level of a ConsumeRetryLater answer
// given in ctx, a concurrent push consumer's callback context (the broker
// redelivers after that level's delay); elsewhere it does nothing.
func SetNextDelayLevel(ctx context.Context, level int) {
	if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
		cc.DelayLevelWhenNextConsume = level
	}
}

// refreshNow makes pc's client read its routes, heartbeat its brokers and
// rebalance now, what Start does for a topic that exists; without it the
// client does so on its own timers (30 s, 20 s). It does nothing when the
// client's layout differs from the pinned version's.
func refreshNow(pc rocketmq.PushConsumer) {
	defer func() { _ = recover() }()
	c, ok := pushClient(pc).(interface {
		UpdateTopicRouteInfo()
		SendHeartbeatToAllBrokerWithLock()
		RebalanceIfNotPaused()
	})
	if !ok {
		return
	}
	c.UpdateTopicRouteInfo()
	c.SendHeartbeatToAllBrokerWithLock()
	c.RebalanceIfNotPaused()
}

// pushClient returns the client instance behind pc (rocketmq-client-go's
// internal RMQClient, field client of its embedded defaultConsumer), or nil
// when the layout differs.
//
// Upstream workaround (no upstream issue found): the public PushConsumer
// has no way to refresh routes, heartbeat or rebalance on demand, so a
// subscription made after Start for a topic created later waits for the
// client's own timers. The field is set once at construction and only read
// here, through reflect and unsafe because it is unexported; the methods
// called take the client's own locks, as its timers do.
func pushClient(pc rocketmq.PushConsumer) (client any) {
	defer func() {
		if recover() != nil {
			client = nil
		}
	}()
	f := field(field(reflect.ValueOf(pc), "defaultConsumer"), "client")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return nil
	}
	return f.Interface()
}

// RetryTopic is group's retry topic, %RETRY%<group>: where the broker puts
// the messages the group hands back.
func RetryTopic(group string) string { return "%RETRY%" + group }

// EnsureRetryTopic errors. Anything else EnsureRetryTopic returns is a
// failure to create the topic on a broker.
var (
	// ErrNoBrokers: the brokers to create the retry topic on are unknown
	// (the subscribed topic has no route yet).
	ErrNoBrokers = errors.New("broker: no route for the subscribed topic")
	// ErrRetryTopicNotRouted: the retry topic was created, but the name
	// server did not route it within RetryTopicSpec.RouteWait.
	ErrRetryTopicNotRouted = errors.New("broker: the retry topic is not routed yet")
)

// RetryTopicSpec says which retry topic EnsureRetryTopic creates and where.
type RetryTopicSpec struct {
	NameServers []string
	Group       string // the retry topic is RetryTopic(Group)
	// Brokers are the master brokers to create it on; empty: those of
	// Topic, asked from the name server.
	Brokers []string
	Topic   string
	// RouteWait, when positive, is how long to wait for the name server to
	// route the created topic.
	RouteWait time.Duration
}

// EnsureRetryTopic creates a group's retry topic (one queue) on the brokers
// of its subscribed topic before its push consumer starts, as the broker
// itself does on the group's first retry. The client learns the route of a
// topic created later only on its periodic refresh (30 s), so the group's
// first retries (and the messages a stopping consumer hands back) would
// otherwise wait that long. An existing retry topic is left alone. Callers
// treat it as best effort: on an error, the broker's own creation remains
// the fallback. The error wraps ErrNoBrokers, ErrRetryTopicNotRouted, or
// each broker's refusal (it tries every broker).
func EnsureRetryTopic(ctx context.Context, s RetryTopicSpec) error {
	retry := RetryTopic(s.Group)
	if _, err := remoting.MasterBrokers(ctx, s.NameServers, 0, retry); err == nil {
		return nil
	}
	brokers := s.Brokers
	if len(brokers) == 0 {
		var err error
		if brokers, err = remoting.MasterBrokers(ctx, s.NameServers, 0, s.Topic); err != nil {
			return fmt.Errorf("%w %s: %w", ErrNoBrokers, s.Topic, err)
		}
	}
	var errs []error
	for _, addr := range brokers {
		if err := remoting.CreateTopic(ctx, addr, 0, retry, 1); err != nil {
			errs = append(errs, fmt.Errorf("broker: create %s on %s: %w", retry, addr, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if s.RouteWait <= 0 {
		return nil
	}
	deadline := time.Now().Add(s.RouteWait)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if _, err := remoting.MasterBrokers(ctx, s.NameServers, 0, retry); err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
	return ErrRetryTopicNotRouted
}
