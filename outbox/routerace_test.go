package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// The first sends of a fresh RocketMQSink to a fresh topic, many at once
// and staggered by microseconds, all succeed, and the broker stores each
// message once (its queue's max offset, read independently, is the
// number of sends). The upstream client fails a send that arrives while another
// one is recording the topic's route ("topic=... route info not found",
// internal/broker/routerace.go): client patch 9 removes that in rmqtx's
// own build, and the seam waits it out in a service built with the
// upstream client, which is what this test proves in the upstream view.
// Measured before the seam waited: an immediate second send failed this
// test too (a CI run of TestOrderPerAggregateOnBroker met it twice in a
// row). No database takes part.
func TestSinkFirstSendsFindTheRoute(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	ctx := context.Background()
	const rounds, senders, stagger = 40, 32, 10 * time.Microsecond
	for r := 0; r < rounds; r++ {
		topic := fmt.Sprintf("%s_%d", testenv.Name(t, "topic"), r)
		testenv.CreateTopic(t, topic, 1) // one queue: the race is per topic, and a queue holds a broker file open
		sink, err := NewRocketMQSink(RocketMQConfig{NameServers: []string{s.NameServer},
			Group: fmt.Sprintf("%s-%d", testenv.Name(t, "pg"), r), InstanceName: fmt.Sprintf("%s-%d", testenv.Name(t, "inst"), r)})
		require.NoError(t, err)
		failed, first := testenv.StaggeredSends(senders, stagger, func(i int) error {
			return sink.Send(ctx, &Message{Event: Event{EventID: wire.NewEventID(), EventType: "RouteProbe",
				AggregateType: "Probe", AggregateID: fmt.Sprintf("p-%d", i), AggregateVersion: 1,
				Destination: topic, Payload: []byte(`{}`)}, Attempt: 1})
		})
		require.NoError(t, sink.Close())
		require.Zero(t, failed, "round %d: %d of %d first sends failed, the first with: %v", r, failed, senders, first)
		stored := testenv.AwaitQueueCount(t, topic, 0, senders, 10*time.Second)
		require.EqualValues(t, senders, stored, "round %d: messages stored on the broker", r)
	}
}
