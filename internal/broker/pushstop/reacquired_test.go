package pushstop_test

import (
	"context"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/pushstop"
)

// fakeQueue and fakeInfo have the shape the gate reads from the client's
// GetConsumerRunningInfo (field names and kinds).
type fakeQueue struct {
	CachedMsgCount int
	Dropped        bool
	CommitOffset   int64
}

type fakeInfo struct {
	MQTable map[primitive.MessageQueue]fakeQueue
}

// fakePC is a suspended push consumer holding one queue; the gate calls
// nothing else on it when it has no name server.
type fakePC struct {
	rocketmq.PushConsumer
	mq primitive.MessageQueue
	q  fakeQueue
}

func (f *fakePC) Suspend() {}

func (f *fakePC) GetConsumerRunningInfo(bool) *fakeInfo {
	return &fakeInfo{MQTable: map[primitive.MessageQueue]fakeQueue{f.mq: f.q}}
}

// consumed runs offsets 0..9 of mq through a gate's wrapped callback: their
// outcomes are recorded, up to offset 9.
func consumed(t *testing.T, mq primitive.MessageQueue) *pushstop.Gate {
	g := pushstop.New("g", nil)
	msgs := make([]*primitive.MessageExt, 10)
	for i := range msgs {
		msgs[i] = &primitive.MessageExt{QueueOffset: int64(i)}
		msgs[i].Queue = &mq
	}
	_, err := g.Wrap(func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		return consumer.ConsumeSuccess, nil
	})(context.Background(), msgs...)
	require.NoError(t, err)
	return g
}

// A queue given back by a rebalance just before Stop holds the broker's
// offset, below the outcomes this consumer recorded before the queue went
// away, and a suspended client pulls nothing that would move it. With
// nothing cached, running or on its way, Stop stops waiting for it after
// its grace and counts it; with messages still cached it keeps waiting
// (until ctx ends); an offset past the outcomes settles at once.
func TestStopLetsGoOfAQueueGivenBack(t *testing.T) {
	t.Parallel()
	mq := primitive.MessageQueue{Topic: "t", BrokerName: "broker-a", QueueId: 1}

	g := consumed(t, mq)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, g.Stop(ctx, &fakePC{mq: mq, q: fakeQueue{CommitOffset: 5}}))
	require.GreaterOrEqual(t, time.Since(start), time.Second, "it waited for the grace first")
	require.EqualValues(t, 1, g.Reacquired())

	g = consumed(t, mq)
	short, cancelShort := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancelShort()
	err := g.Stop(short, &fakePC{mq: mq, q: fakeQueue{CommitOffset: 5, CachedMsgCount: 2}})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "1 queues whose offset lags")
	require.Zero(t, g.Reacquired())

	g = consumed(t, mq)
	require.NoError(t, g.Stop(ctx, &fakePC{mq: mq, q: fakeQueue{CommitOffset: 10}}))
	require.Zero(t, g.Reacquired(), "settled by the offset, not by the grace")
}
