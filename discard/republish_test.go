package discard_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// A republished event goes to the queue of its aggregate: the message
// Recovery publishes carries the routing key of the row's envelope
// (aggregate, else business key) as sharding key, and the selector the
// Recovery's own publisher uses picks wire.QueueFor's queue for it, the
// queue txproducer.Send chose for the event's other versions.
func TestRepublishRoutesByAggregate(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	row := func(id string, env wire.Envelope, extra map[string]string) txlog.Row {
		env.EventID, env.EventType = id, "T"
		props := env.Properties(body)
		props["UNIQ_KEY"] = "u1"
		for k, v := range extra {
			props[k] = v
		}
		js, err := json.Marshal(props)
		require.NoError(t, err)
		return txlog.Row{EventID: id, ProducerGroup: "g", Topic: "orders", Keys: id, EventType: "T", State: txlog.StateCommitted,
			Payload: body, PayloadHash: wire.Hash(body), Properties: string(js), BusinessKey: env.BusinessKey, ResolvedBy: txlog.ByLocalCommit}
	}
	queues := make([]*primitive.MessageQueue, 8)
	for i := range queues {
		queues[i] = &primitive.MessageQueue{Topic: "orders", BrokerName: "b", QueueId: i}
	}
	sel := rmqroute.New()
	for _, tc := range []struct {
		name string
		row  txlog.Row
		key  string
	}{
		{"aggregate", row("a", wire.Envelope{AggregateType: "Order", AggregateID: "o-42", AggregateVersion: 3, BusinessKey: "ORD-1"}, nil), "Order/o-42"},
		{"business key", row("b", wire.Envelope{BusinessKey: "ORD-2024-0001"}, nil), "ORD-2024-0001"},
		// The row's column wins over a stored copy, as for the property.
		{"business key column", func() txlog.Row {
			r := row("c", wire.Envelope{BusinessKey: "old"}, nil)
			r.BusinessKey = "ORD-7"
			return r
		}(), "ORD-7"},
		// A stored sharding key (txproducer stores the message's properties)
		// is replaced by the one the envelope gives, or dropped.
		{"stale stored key", row("d", wire.Envelope{AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 1},
			map[string]string{primitive.PropertyShardingKey: "elsewhere"}), "Order/o-1"},
		{"no key", row("e", wire.Envelope{}, map[string]string{primitive.PropertyShardingKey: "elsewhere"}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := discard.RepublishMessage(tc.row)
			require.NoError(t, err)
			require.Equal(t, tc.key, m.GetShardingKey())
			if tc.key == "" {
				return
			}
			q := sel.Select(m, queues, "")
			require.Equal(t, wire.QueueFor(tc.key, len(queues)), q.QueueId)
			require.Equal(t, q, sel.Select(m, queues, "b"), "a retry keeps the queue")
		})
	}

	// Through Recovery: the message handed to the publisher carries the key.
	log := newFakeLog()
	log.rows["a"] = row("a", wire.Envelope{AggregateType: "Order", AggregateID: "o-42", AggregateVersion: 3}, nil)
	pub := &fakePublisher{}
	res, err := recovery(t, log, pub).Handle(context.Background(), discarded("g", "a", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryRepublished, res.Decision)
	require.Len(t, pub.sent, 1)
	require.Equal(t, "Order/o-42", pub.sent[0].GetShardingKey())
	require.Equal(t, "o-42", pub.sent[0].GetProperty(wire.PropAggregateID))
}
