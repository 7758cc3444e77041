package pushstop_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/pushstop"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// The broker's QUERY_CONSUMER_OFFSET and UPDATE_CONSUMER_OFFSET requests.
const (
	reqQueryConsumerOffset  = 14
	reqUpdateConsumerOffset = 15
)

// TestShutdownWritesTheOffsetsLast: a pull the client built before Stop
// carries the offset of that moment, and the broker stores it even when it
// is lower than the stored one. Such a pull reaching the broker after
// Stop's write (a pull goroutine descheduled between its suspend check and
// its send, or slow pull threads in the broker) moved the group's offset
// back below a message already consumed; the client's one-way persist at
// Shutdown repaired it only when it landed after the pull. Here the stale
// pull's offset is written just after the client's Shutdown, the latest a
// request of the client's can land: Shutdown's final write must still win.
// No database: the offsets are the broker's alone.
func TestShutdownWritesTheOffsetsLast(t *testing.T) {
	s := testenv.Integration(t)
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "cg")
	testenv.CreateTopic(t, topic, 1)
	brokers, err := remoting.MasterBrokers(t.Context(), []string{s.NameServer}, 0, topic)
	require.NoError(t, err)
	require.Len(t, brokers, 1, "the test bed has one master")

	const sent = 3
	p := testenv.Producer(t)
	for i := range sent {
		_, err := p.SendSync(t.Context(), primitive.NewMessage(topic, []byte(strconv.Itoa(i))))
		require.NoError(t, err)
	}

	g := pushstop.New(group, []string{s.NameServer})
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithGroupName(group),
		consumer.WithInstance(group),
		consumer.WithNsResolver(primitive.NewPassthroughResolver([]string{s.NameServer})),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		g.Option(),
	)
	require.NoError(t, err)
	var consumed atomic.Int64
	var mq primitive.MessageQueue
	var mqSet atomic.Bool
	require.NoError(t, pc.Subscribe(topic, consumer.MessageSelector{}, g.Wrap(
		func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			if mqSet.CompareAndSwap(false, true) {
				mq = *msgs[0].Queue
			}
			consumed.Add(int64(len(msgs)))
			return consumer.ConsumeSuccess, nil
		})))
	require.NoError(t, pc.Start())
	testenv.Eventually(t, 60*time.Second, "the consumer to consume every message", func() bool {
		return consumed.Load() == sent
	})

	write := func(offset int64) {
		h, _, err := remoting.RoundTrip(t.Context(), brokers[0], 5*time.Second, reqUpdateConsumerOffset, map[string]string{
			"consumerGroup": group, "topic": topic, "queueId": strconv.Itoa(mq.QueueId),
			"commitOffset": strconv.FormatInt(offset, 10), "bname": mq.BrokerName,
		})
		require.NoError(t, err)
		require.Equal(t, remoting.ResSuccess, h.Code, h.Remark)
	}
	pushstop.SetAfterClientShutdown(g, func() { write(sent - 1) }) // the stale pull: the last message not yet consumed
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, g.Shutdown(ctx, pc))

	h, _, err := remoting.RoundTrip(t.Context(), brokers[0], 5*time.Second, reqQueryConsumerOffset, map[string]string{
		"consumerGroup": group, "topic": topic, "queueId": strconv.Itoa(mq.QueueId),
	})
	require.NoError(t, err)
	require.Equal(t, remoting.ResSuccess, h.Code, h.Remark)
	require.Equal(t, strconv.Itoa(sent), h.ExtFields["offset"], "the broker's offset must cover every consumed message")
}
