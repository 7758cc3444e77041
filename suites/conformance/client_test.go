package conformance

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/internal/broker/pushstop"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// deliveryBound bounds every wait for a delivery. A delivery takes
// milliseconds on both backends; the bound covers a retry delay of level 1
// (1 s on the real broker) and a reconnect after a restart on a loaded
// machine.
const deliveryBound = 30 * time.Second

// The raw clients below are exactly what a user of rocketmq-client-go
// writes: each has its own group and instance name (an instance name
// shared by two clients in one process would make them one client).

func resolver(b Backend) primitive.NsResolver {
	return primitive.NewPassthroughResolver(b.NameServers())
}

// newProducer starts a plain producer on b, shut down when the test ends.
func newProducer(t testing.TB, b Backend, opts ...producer.Option) rocketmq.Producer {
	t.Helper()
	group := testenv.Name(t, "pub")
	p, err := rocketmq.NewProducer(append([]producer.Option{
		producer.WithNsResolver(resolver(b)),
		producer.WithGroupName(group),
		producer.WithInstanceName(group),
		producer.WithRetry(2),
	}, opts...)...)
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("producer start: %v", err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// listener is a transaction listener whose answers the test sets. It
// counts the checks it answered, per answer.
type listener struct {
	exec    primitive.LocalTransactionState
	answer  atomic.Int32 // the LocalTransactionState a check gets
	checked [4]atomic.Int32
}

func newListener(exec, check primitive.LocalTransactionState) *listener {
	l := &listener{exec: exec}
	l.answer.Store(int32(check))
	return l
}

func (l *listener) ExecuteLocalTransaction(*primitive.Message) primitive.LocalTransactionState {
	return l.exec
}

func (l *listener) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	a := primitive.LocalTransactionState(l.answer.Load())
	l.checked[a].Add(1)
	return a
}

// answer sets what the next checks get.
func (l *listener) setAnswer(s primitive.LocalTransactionState) { l.answer.Store(int32(s)) }

// checks is how many checks were answered s.
func (l *listener) checks(s primitive.LocalTransactionState) int { return int(l.checked[s].Load()) }

// newTxProducer starts a transaction producer with listener l on b.
func newTxProducer(t testing.TB, b Backend, l *listener) rocketmq.TransactionProducer {
	t.Helper()
	group := testenv.Name(t, "txp")
	p, err := rocketmq.NewTransactionProducer(l,
		producer.WithNsResolver(resolver(b)),
		producer.WithGroupName(group),
		producer.WithInstanceName(group),
		producer.WithRetry(2),
	)
	if err != nil {
		t.Fatalf("transaction producer: %v", err)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("transaction producer start: %v", err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// sendHalf sends body to topic as a transactional message; the listener's
// exec answer decides it (unless its END_TRANSACTION is lost).
func sendHalf(t testing.TB, p rocketmq.TransactionProducer, topic, body string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := p.SendMessageInTransaction(ctx, primitive.NewMessage(topic, []byte(body)))
	if err != nil {
		t.Fatalf("send half: %v", err)
	}
	if res.Status != primitive.SendOK {
		t.Fatalf("send half: status %v", res.Status)
	}
}

// send sends body to topic with a plain producer.
func send(t testing.TB, p rocketmq.Producer, msg *primitive.Message) *primitive.SendResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := p.SendSync(ctx, msg)
	if err != nil {
		t.Fatalf("send to %s: %v", msg.Topic, err)
	}
	if res.Status != primitive.SendOK {
		t.Fatalf("send to %s: status %v", msg.Topic, res.Status)
	}
	return res
}

// delivery is one message a sink's consumer was handed.
type delivery struct {
	Body      string
	Topic     string
	Queue     int
	Offset    int64
	Reconsume int32
}

// sinkOpts configure a sink's consumer.
type sinkOpts struct {
	group        string // "": a fresh group
	maxReconsume int32  // 0: the client's default (16)
	orderly      bool
	// fail makes the consumer answer RetryLater for a delivery, asking
	// for delay level 1 (1 s on the real broker; the fake skips delays).
	fail func(delivery) bool
}

// sink is an independent push consumer (its own group) that records every
// delivery of a topic: what "a consumer finally sees" on both backends.
type sink struct {
	mu      sync.Mutex
	got     []delivery
	changed chan struct{}
}

// consume starts a sink on topic, shut down when the test ends.
func consume(t testing.TB, b Backend, topic string, o sinkOpts) *sink {
	t.Helper()
	group := o.group
	if group == "" {
		group = testenv.Name(t, "cg")
	}
	s := &sink{changed: make(chan struct{})}
	opts := []consumer.Option{
		consumer.WithGroupName(group),
		consumer.WithInstance(group),
		consumer.WithNsResolver(resolver(b)),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	}
	if o.maxReconsume > 0 {
		opts = append(opts, consumer.WithMaxReconsumeTimes(o.maxReconsume))
	}
	callback := func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		result := consumer.ConsumeSuccess
		s.mu.Lock()
		for _, m := range msgs {
			d := delivery{Body: string(m.Body), Topic: m.Topic, Offset: m.QueueOffset, Reconsume: m.ReconsumeTimes}
			if m.Queue != nil {
				d.Queue = m.Queue.QueueId
			}
			s.got = append(s.got, d)
			if o.fail != nil && o.fail(d) {
				result = consumer.ConsumeRetryLater
			}
		}
		close(s.changed)
		s.changed = make(chan struct{})
		s.mu.Unlock()
		if result == consumer.ConsumeRetryLater {
			if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
				cc.DelayLevelWhenNextConsume = 1
			}
		}
		return result, nil
	}
	var pc rocketmq.PushConsumer
	var err error
	if o.orderly {
		// The gate below is for concurrent consumption only; the patched
		// client's own Shutdown is safe (third_party/rocketmq-client-go,
		// patch 3).
		pc, err = rocketmq.NewPushConsumer(append(opts, consumer.WithConsumerOrder(true))...)
		if err == nil {
			err = pc.Subscribe(topic, consumer.MessageSelector{}, callback)
		}
		if err == nil {
			t.Cleanup(func() { _ = pc.Shutdown() })
		}
	} else {
		// The gate stops delivery before the client's Shutdown
		// (internal/broker/pushstop).
		gate := pushstop.New(group, nil)
		pc, err = rocketmq.NewPushConsumer(append(opts, gate.Option())...)
		if err == nil {
			err = pc.Subscribe(topic, consumer.MessageSelector{}, gate.Wrap(callback))
		}
		if err == nil {
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = gate.Shutdown(ctx, pc)
			})
		}
	}
	if err != nil {
		t.Fatalf("consumer of %s: %v", topic, err)
	}
	if err := pc.Start(); err != nil {
		t.Fatalf("consumer start: %v", err)
	}
	return s
}

// deliveries returns a copy of what the sink saw, in delivery order.
func (s *sink) deliveries() []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]delivery(nil), s.got...)
}

// of returns the deliveries of body, in delivery order.
func (s *sink) of(body string) []delivery {
	var out []delivery
	for _, d := range s.deliveries() {
		if d.Body == body {
			out = append(out, d)
		}
	}
	return out
}

// count is how many times body was delivered.
func (s *sink) count(body string) int { return len(s.of(body)) }

// await blocks until cond holds for the deliveries, re-evaluating on each
// delivery, and fails t when it does not within deliveryBound.
func (s *sink) await(t testing.TB, what string, cond func([]delivery) bool) {
	t.Helper()
	s.awaitWithin(t, deliveryBound, what, cond)
}

// awaitWithin is await with its own bound.
func (s *sink) awaitWithin(t testing.TB, bound time.Duration, what string, cond func([]delivery) bool) {
	t.Helper()
	deadline := time.NewTimer(bound)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		ch := s.changed
		s.mu.Unlock()
		if cond(s.deliveries()) {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("waited %s for %s; deliveries: %+v", bound, what, s.deliveries())
		}
	}
}

// awaitBody waits until body was delivered at least n times.
func (s *sink) awaitBody(t testing.TB, body string, n int) {
	t.Helper()
	s.await(t, "delivery of "+body, func([]delivery) bool { return s.count(body) >= n })
}
