package wire

// Queue routing: which of a topic's write queues an event goes to. Every
// rmqtx sender (txproducer.Send, outbox.RocketMQSink) chooses the queue the
// same way, so the events of one aggregate land on one queue in the order
// they were sent, whichever path sent them. A producer in another language
// follows the same two functions (WIRE.md, "Queue routing", with test
// vectors).

// RoutingKey returns the key an event is routed by: the aggregate,
// aggregateType + "/" + aggregateID, when aggregateID is set; else the
// business key; else "" (no key: the sender spreads such events over the
// queues as it likes). The "/" joins the two parts without escaping: two
// aggregates whose joined keys coincide share a queue, which costs only
// parallelism.
func RoutingKey(aggregateType, aggregateID, businessKey string) string {
	if aggregateID != "" {
		return aggregateType + "/" + aggregateID
	}
	return businessKey
}

// EnvelopeRoutingKey is RoutingKey of e's aggregate and business key.
func (e Envelope) RoutingKey() string {
	return RoutingKey(e.AggregateType, e.AggregateID, e.BusinessKey)
}

// PropertiesRoutingKey is RoutingKey read from a message's user properties
// (PropAggregateType, PropAggregateID, PropBusinessKey), for readers that
// have not decoded the envelope.
func PropertiesRoutingKey(props map[string]string) string {
	return RoutingKey(props[PropAggregateType], props[PropAggregateID], props[PropBusinessKey])
}

// FNV-1a, 32 bits (http://www.isthe.com/chongo/tech/comp/fnv/).
const (
	fnvOffset32 = 2166136261
	fnvPrime32  = 16777619
)

// KeyHash is the 32-bit FNV-1a hash of key's UTF-8 bytes: start with
// 2166136261; for each byte, XOR it in, then multiply by 16777619 modulo
// 2^32. It is what rocketmq-client-go's hash queue selector computes.
func KeyHash(key string) uint32 {
	h := uint32(fnvOffset32)
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= fnvPrime32
	}
	return h
}

// QueueFor returns the index, in [0, queues), of the queue key goes to:
// KeyHash(key) as an unsigned 32-bit number, modulo queues. The index
// counts the topic's write queues as RocketMQ clients list them: brokers
// sorted by name, each broker's write queues by id (WIRE.md). It returns -1
// for an empty key or queues < 1: no routing, any queue.
func QueueFor(key string, queues int) int {
	if key == "" || queues < 1 {
		return -1
	}
	return int(uint64(KeyHash(key)) % uint64(queues))
}
