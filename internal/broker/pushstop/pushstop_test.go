package pushstop

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/hooks"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"
)

// The real client's queue table is read through GetConsumerRunningInfo;
// these types have the shape that reflection looks for (field names, kinds).
type fakeQueueInfo struct {
	CommitOffset   int64
	CachedMsgCount int
	Dropped        bool
}

type fakeRunningInfo struct {
	MQTable map[primitive.MessageQueue]fakeQueueInfo
}

// fakePC is a push consumer whose queue table the test sets. Its Suspend
// records whether the gate was still open, to check the order of the steps.
type fakePC struct {
	rocketmq.PushConsumer // methods the gate does not call panic if called

	g *Gate

	mu                sync.Mutex
	table             map[primitive.MessageQueue]fakeQueueInfo
	suspended         int
	gateOpenAtSuspend bool
	shutdowns         int
}

func (f *fakePC) Suspend() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.suspended++
	f.g.mu.Lock()
	f.gateOpenAtSuspend = !f.g.closed
	f.g.mu.Unlock()
}

func (f *fakePC) Shutdown() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.shutdowns++
	return nil
}

func (f *fakePC) GetConsumerRunningInfo(bool) *fakeRunningInfo {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := make(map[primitive.MessageQueue]fakeQueueInfo, len(f.table))
	for k, v := range f.table {
		t[k] = v
	}
	return &fakeRunningInfo{MQTable: t}
}

func (f *fakePC) set(mq primitive.MessageQueue, q fakeQueueInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.table == nil {
		f.table = map[primitive.MessageQueue]fakeQueueInfo{}
	}
	f.table[mq] = q
}

// withoutInfo is a push consumer with no GetConsumerRunningInfo method.
type withoutInfo struct {
	rocketmq.PushConsumer
}

func (withoutInfo) Suspend() {}

var q0 = primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: 0}

// pulled builds the messages of one pull result as the client does: each
// message points at its queue.
func pulled(mq primitive.MessageQueue, offsets ...int64) []*primitive.MessageExt {
	out := make([]*primitive.MessageExt, len(offsets))
	for i, o := range offsets {
		q := mq
		m := &primitive.MessageExt{QueueOffset: o}
		m.Queue = &q
		out[i] = m
	}
	return out
}

func hook(t *testing.T, g *Gate, mq primitive.MessageQueue, msgs []*primitive.MessageExt) []*primitive.MessageExt {
	t.Helper()
	q := mq
	out, err := g.Hook(&hooks.FilterMessageContext{MQ: &q, Msg: msgs})
	require.NoError(t, err)
	return out
}

func stopWithin(g *Gate, pc rocketmq.PushConsumer, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return g.Stop(ctx, pc)
}

func TestHookPassesThroughUntilClosed(t *testing.T) {
	g := New("", nil)
	pc := &fakePC{g: g}
	msgs := pulled(q0, 10, 11)
	require.Equal(t, msgs, hook(t, g, q0, msgs), "an open gate changes nothing")
	require.Len(t, g.pending, 1)

	// Delivering it proves the put happened; Stop then returns at once.
	ok := g.Wrap(func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		return consumer.ConsumeSuccess, nil
	})
	res, err := ok(context.Background(), msgs[1])
	require.NoError(t, err)
	require.Equal(t, consumer.ConsumeSuccess, res)
	require.Empty(t, g.pending)
	pc.set(q0, fakeQueueInfo{CommitOffset: 12})
	require.NoError(t, stopWithin(g, pc, time.Second))
	require.Equal(t, 1, pc.suspended)
	require.True(t, pc.gateOpenAtSuspend, "Suspend runs before the gate closes")
	require.Zero(t, pc.shutdowns, "Stop does not shut down")

	// Closed: a pull result that arrives now puts nothing.
	require.Empty(t, hook(t, g, q0, pulled(q0, 12, 13, 14)))
	require.EqualValues(t, 3, g.Discarded())
	require.Empty(t, g.pending)
}

// A batch let through before the gate closed and not yet delivered holds
// Stop until it is delivered.
func TestStopWaitsForAnUndeliveredBatch(t *testing.T) {
	g := New("", nil)
	pc := &fakePC{g: g}
	pc.set(q0, fakeQueueInfo{CommitOffset: 5, CachedMsgCount: 2})
	msgs := hook(t, g, q0, pulled(q0, 5, 6))
	deliver := g.Wrap(func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		pc.set(q0, fakeQueueInfo{CommitOffset: 7}) // acknowledged: the cache empties
		return consumer.ConsumeSuccess, nil
	})

	err := stopWithin(g, pc, 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "1 pull results not yet handed over")
	require.Contains(t, err.Error(), "2 messages cached")

	done := make(chan error, 1)
	go func() { done <- stopWithin(g, pc, 10*time.Second) }()
	_, err = deliver(context.Background(), msgs...)
	require.NoError(t, err)
	require.NoError(t, <-done)
}

// A callback in progress holds Stop until it returns.
func TestStopWaitsForRunningCallbacks(t *testing.T) {
	g := New("", nil)
	pc := &fakePC{g: g}
	release, entered := make(chan struct{}), make(chan struct{})
	slow := g.Wrap(func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		close(entered)
		<-release
		return consumer.ConsumeSuccess, nil
	})
	go func() { _, _ = slow(context.Background(), pulled(q0, 1)...) }()
	<-entered
	err := stopWithin(g, pc, 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "1 callbacks running")
	close(release)
	require.NoError(t, stopWithin(g, pc, 10*time.Second))
}

// Messages still cached (delivered but not yet acknowledged, or prefetched
// and not yet handed back) hold Stop; a dropped queue's do not.
func TestStopWaitsForTheCacheToEmpty(t *testing.T) {
	g := New("", nil)
	pc := &fakePC{g: g}
	q1 := primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: 1}
	pc.set(q0, fakeQueueInfo{CachedMsgCount: 3})
	pc.set(q1, fakeQueueInfo{CachedMsgCount: 7, Dropped: true})
	err := stopWithin(g, pc, 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "3 messages cached")
	pc.set(q0, fakeQueueInfo{})
	require.NoError(t, stopWithin(g, pc, 10*time.Second))
}

// The proofs besides delivery: the queue was taken away, or dropped, or
// its committed offset is past the batch.
func TestUndeliveredBatchSettledByTheQueueTable(t *testing.T) {
	for name, q := range map[string]*fakeQueueInfo{
		"queue no longer held": nil,
		"queue dropped":        {Dropped: true},
		"offset committed":     {CommitOffset: 9},
	} {
		t.Run(name, func(t *testing.T) {
			g := New("", nil)
			pc := &fakePC{g: g}
			if q != nil {
				pc.set(q0, *q)
			}
			hook(t, g, q0, pulled(q0, 7, 8))
			require.NoError(t, stopWithin(g, pc, 10*time.Second))
			require.Empty(t, g.pending)
		})
	}
	// The control: a committed offset at the batch's last message is no proof.
	g := New("", nil)
	pc := &fakePC{g: g}
	pc.set(q0, fakeQueueInfo{CommitOffset: 8})
	hook(t, g, q0, pulled(q0, 7, 8))
	require.ErrorIs(t, stopWithin(g, pc, 50*time.Millisecond), context.DeadlineExceeded)
}

// A newer batch for a queue replaces the older one: the queue's pull
// goroutine put the older one before it pulled again.
func TestNewerBatchReplacesOlder(t *testing.T) {
	g := New("", nil)
	hook(t, g, q0, pulled(q0, 1, 2))
	newer := hook(t, g, q0, pulled(q0, 3, 4))
	require.Len(t, g.pending, 1)
	require.Same(t, newer[0], g.pending[q0].msgs[0])
	require.EqualValues(t, 4, g.pending[q0].last)
}

// Without GetConsumerRunningInfo, deliveries are the only proof.
func TestStopWithoutQueueTable(t *testing.T) {
	g := New("", nil)
	pc := withoutInfo{}
	_, ok := queueTable(pc)
	require.False(t, ok)
	msgs := hook(t, g, q0, pulled(q0, 1))
	err := stopWithin(g, pc, 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "queue table unreadable")
	_, err = g.Wrap(func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		return consumer.ConsumeSuccess, nil
	})(context.Background(), msgs...)
	require.NoError(t, err)
	require.NoError(t, stopWithin(g, pc, 10*time.Second))
}

// Shutdown shuts the consumer down even when Stop ran out of time, and says so.
func TestShutdownAfterTimeout(t *testing.T) {
	g := New("", nil)
	pc := &fakePC{g: g}
	pc.set(q0, fakeQueueInfo{CachedMsgCount: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err := g.Shutdown(ctx, pc)
	require.True(t, errors.Is(err, context.DeadlineExceeded), err)
	require.Equal(t, 1, pc.shutdowns)
}

// The reflection reads the real client's running info: a push consumer
// that never started holds no queue.
func TestQueueTableOfTheRealClient(t *testing.T) {
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithGroupName("pushstop-unit"),
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{"127.0.0.1:9876"})),
	)
	require.NoError(t, err)
	qs, ok := queueTable(pc)
	require.True(t, ok, "GetConsumerRunningInfo's shape changed: Stop would rely on deliveries alone")
	require.Empty(t, qs)
}

// An empty cache is not enough: the client removes a message from its cache
// before it moves the queue's offset. Stop waits for the offset too.
func TestStopWaitsForTheOffsetToCoverOutcomes(t *testing.T) {
	g := New("", nil)
	pc := &fakePC{g: g}
	msgs := hook(t, g, q0, pulled(q0, 4, 5))
	deliver := g.Wrap(func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		return consumer.ConsumeSuccess, nil
	})
	_, err := deliver(context.Background(), msgs...)
	require.NoError(t, err)
	pc.set(q0, fakeQueueInfo{CommitOffset: 5}) // removed from the cache, offset not yet moved past 5
	err = stopWithin(g, pc, 50*time.Millisecond)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "1 queues whose offset lags")
	pc.set(q0, fakeQueueInfo{CommitOffset: 6})
	require.NoError(t, stopWithin(g, pc, 10*time.Second))
}

// A queue read again from below what was consumed (given back after a
// rebalance) is judged by the new reads, not the old outcomes.
func TestRereadQueueForgetsOldOutcomes(t *testing.T) {
	g := New("", nil)
	deliver := g.Wrap(func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		return consumer.ConsumeSuccess, nil
	})
	_, err := deliver(context.Background(), hook(t, g, q0, pulled(q0, 8, 9))...)
	require.NoError(t, err)
	require.EqualValues(t, 9, g.returned[q0])
	hook(t, g, q0, pulled(q0, 10, 11))
	require.EqualValues(t, 9, g.returned[q0], "reading on keeps the outcomes")
	hook(t, g, q0, pulled(q0, 8, 9, 10))
	require.NotContains(t, g.returned, q0)
}
