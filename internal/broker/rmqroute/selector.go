// Package rmqroute is the rocketmq-client-go queue selector every rmqtx
// sender uses: a message with a sharding key goes to the queue
// wire.QueueFor picks for it (WIRE.md, "Queue routing"), so txproducer and
// the outbox agree with each other and with producers in other languages;
// a message without one goes to the next queue in turn.
package rmqroute

import (
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/wire"
)

// Selector implements producer.QueueSelector. The zero value is not usable:
// create it with New.
type Selector struct {
	spread producer.QueueSelector // messages without a key (it locks itself)
}

// New returns a selector.
func New() *Selector {
	return &Selector{spread: producer.NewRoundRobinQueueSelector()}
}

var _ producer.QueueSelector = (*Selector)(nil)

// Select implements producer.QueueSelector. queues is the topic's write
// queue list as the client builds it (brokers by name, queues by id), the
// list wire.QueueFor indexes. A retry after a failed send (lastBroker set)
// returns the same queue for a keyed message: skipping the failed broker
// would break the order of its key.
func (s *Selector) Select(m *primitive.Message, queues []*primitive.MessageQueue, lastBroker string) *primitive.MessageQueue {
	if len(queues) == 0 {
		return nil
	}
	if i := wire.QueueFor(m.GetShardingKey(), len(queues)); i >= 0 {
		return queues[i]
	}
	return s.spread.Select(m, queues, lastBroker)
}

// SetKey sets m's sharding key to the routing key of env (nothing when it
// has none).
func SetKey(m *primitive.Message, env wire.Envelope) {
	if k := env.RoutingKey(); k != "" {
		m.WithShardingKey(k)
	}
}
