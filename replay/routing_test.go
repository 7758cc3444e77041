package replay_test

import (
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/wire"
)

// A replayed dead letter goes to the queue of its aggregate: the message
// carries the envelope's routing key (aggregate, else business key) as
// sharding key, and the selector the replayer's producer uses picks
// wire.QueueFor's queue for it, the queue the original sender chose.
// TestReplayEndToEnd checks the queue on the broker.
func TestReplayMessageRoutesByAggregate(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	queues := make([]*primitive.MessageQueue, 4)
	for i := range queues {
		queues[i] = &primitive.MessageQueue{Topic: "orders", BrokerName: "b", QueueId: i}
	}
	sel := rmqroute.New()
	for _, tc := range []struct {
		env wire.Envelope
		key string
	}{
		{wire.Envelope{AggregateType: "Order", AggregateID: "o-42", AggregateVersion: 2, BusinessKey: "ORD-1"}, "Order/o-42"},
		{wire.Envelope{BusinessKey: "ORD-2024-0001"}, "ORD-2024-0001"},
		{wire.Envelope{}, ""},
	} {
		tc.env.EventID, tc.env.EventType = wire.NewEventID(), "OrderPaid"
		props := tc.env.Properties(body)
		props[replay.PropAuditID] = "7"
		m := replay.ReplayMessage(consumer.DeadLetter{Topic: "orders", Payload: body}, props)
		require.Equal(t, "orders", m.Topic)
		require.Equal(t, body, m.Body)
		require.Equal(t, "7", m.GetProperty(replay.PropAuditID))
		require.Equal(t, tc.key, m.GetShardingKey())
		if tc.key != "" {
			require.Equal(t, wire.QueueFor(tc.key, len(queues)), sel.Select(m, queues, "").QueueId, tc.key)
		}
	}
}
