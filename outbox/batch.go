package outbox

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/wire"
)

// BatchSink is a Sink that can deliver several messages in one request.
// When the configured Sink implements it, the dispatcher hands each claim's
// rows to Batches and sends every group with SendBatch (one group per
// sender at a time); a group of one is sent with Send.
type BatchSink interface {
	Sink
	// Batches splits the messages of one claim, in claim order, into groups
	// that SendBatch may send together, each group in the order given. Every
	// message is in exactly one group; one the sink cannot batch is a group
	// of its own.
	Batches(msgs []*Message) [][]*Message
	// SendBatch delivers one group of Batches and returns one error per
	// message (nil: the receiver has it), classified as Send's errors are.
	// It must honour ctx as Send does.
	SendBatch(ctx context.Context, msgs []*Message) []error
}

// DefaultMaxBatchBytes bounds the estimated size of one RocketMQ batch:
// well under the broker's default maxMessageSize (4 MiB), which applies to
// the whole batch.
const DefaultMaxBatchBytes = 1 << 20

// maxBatchMessages bounds the messages of one RocketMQ batch.
const maxBatchMessages = 256

// batchOverhead is a generous estimate of one message's encoding beyond its
// payload (properties: envelope, keys, tag, UNIQ_KEY).
const batchOverhead = 2048

// Batches groups msgs into RocketMQ batches: one per destination topic and
// target queue, at most MaxBatchBytes (estimated) and 256 messages each, in
// claim order. The target queue of a message with a sharding key is the one
// Send would choose for it alone (the hash of the key over the topic's
// queues), so every event of one aggregate still lands on one queue, and the
// broker stores a batch in order; messages without a key share a batch on
// any queue. A message whose own size is above half of MaxBatchBytes, an
// invalid one (Send classifies it), and a keyed message of a topic whose
// queues this sink has not seen yet (its first send learns them) go alone.
func (s *RocketMQSink) Batches(msgs []*Message) [][]*Message {
	if s.maxBatchBytes <= 0 {
		return alone(msgs)
	}
	type target struct {
		topic string
		queue int // index in the topic's queue list; -1: any queue
	}
	var (
		order  []target
		groups = map[target][]*Message{}
		out    [][]*Message
	)
	for _, m := range msgs {
		if !rmqname.ValidTopic(m.Destination) || m.Envelope().Validate() != nil ||
			len(m.Payload)+batchOverhead > s.maxBatchBytes/2 {
			out = append(out, []*Message{m})
			continue
		}
		t := target{topic: m.Destination, queue: -1}
		if key := ShardingKey(m.Event); key != "" {
			n := s.queues.count(m.Destination)
			if n == 0 {
				out = append(out, []*Message{m})
				continue
			}
			t.queue = queueIndex(key, n)
		}
		if _, ok := groups[t]; !ok {
			order = append(order, t)
		}
		groups[t] = append(groups[t], m)
	}
	for _, t := range order {
		g := groups[t]
		for len(g) > 0 {
			k, size := 0, 0
			for k < len(g) && k < maxBatchMessages {
				sz := len(g[k].Payload) + batchOverhead
				if k > 0 && size+sz > s.maxBatchBytes {
					break
				}
				size += sz
				k++
			}
			out = append(out, g[:k:k])
			g = g[k:]
		}
	}
	return out
}

func alone(msgs []*Message) [][]*Message {
	out := make([][]*Message, len(msgs))
	for i, m := range msgs {
		out[i] = []*Message{m}
	}
	return out
}

// SendBatch sends msgs (a group of Batches) as one RocketMQ batch with
// SendSync and returns the same outcome for each of them: the broker stores
// a batch whole or not at all. When the broker refuses the batch (it
// answered with an error code, so it stored none of it: a batch above its
// maxMessageSize is refused with code 1, "message body size exceeded"), or
// the error is permanent, it may be one message's fault, so every message
// is then sent alone and gets its own outcome. A timeout or a lost
// connection leaves the batch's outcome unknown for all of its messages.
func (s *RocketMQSink) SendBatch(ctx context.Context, msgs []*Message) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 1 {
		errs[0] = s.Send(ctx, msgs[0])
		return errs
	}
	pm := make([]*broker.Message, len(msgs))
	for i, m := range msgs {
		if err := s.validate(m); err != nil {
			return s.eachAlone(ctx, msgs)
		}
		pm[i] = RocketMQMessage(m)
	}
	// The batch goes to the queue its messages map to (see Batches); the
	// client copies the first message's Queue onto the batch, and the
	// sink's selector honours it.
	pm[0].Queue = s.queues.pick(msgs[0])
	// SendBatch gives each message the UNIQ_KEY a single send would carry
	// (the client gives a batch's messages none).
	res, err := s.p.SendBatch(ctx, pm)
	var out error
	if err != nil {
		out = classifyRocketMQ(ctx, err)
		if _, coded := brokerclass.CodeOf(err); ctx.Err() == nil && (sendClassOf(out) == ClassPermanent || coded) {
			return s.eachAlone(ctx, msgs)
		}
	} else {
		out = sendStatus(res)
	}
	for i := range errs {
		errs[i] = out
	}
	return errs
}

func (s *RocketMQSink) eachAlone(ctx context.Context, msgs []*Message) []error {
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		errs[i] = s.Send(ctx, m)
	}
	return errs
}

// queueIndex is the queue a sharding key maps to among n (wire.QueueFor,
// the rule every rmqtx sender follows).
func queueIndex(key string, n int) int { return wire.QueueFor(key, n) }

// queueBook is the sink's queue selector: rmqroute's selection
// (wire.QueueFor) for single messages, a batch's own queue for batches, and a record of each
// topic's queue list as the client last passed it, which Batches groups by.
type queueBook struct {
	hash    broker.QueueSelector
	mu      sync.RWMutex
	byTopic map[string][]*broker.MessageQueue
	rr      atomic.Uint32
}

func newQueueBook() *queueBook {
	return &queueBook{hash: rmqroute.New(), byTopic: map[string][]*broker.MessageQueue{}}
}

// Select implements broker.QueueSelector.
func (b *queueBook) Select(m *broker.Message, queues []*broker.MessageQueue, lastBroker string) *broker.MessageQueue {
	b.record(m.Topic, queues)
	if m.Batch && m.Queue != nil {
		for _, q := range queues {
			if q.BrokerName == m.Queue.BrokerName && q.QueueId == m.Queue.QueueId {
				return q
			}
		}
		// The route changed since the batch was grouped: any queue.
	}
	return b.hash.Select(m, queues, lastBroker)
}

func (b *queueBook) record(topic string, queues []*broker.MessageQueue) {
	b.mu.RLock()
	old := b.byTopic[topic]
	b.mu.RUnlock()
	if sameQueues(old, queues) {
		return
	}
	cp := make([]*broker.MessageQueue, len(queues))
	for i, q := range queues {
		c := *q
		cp[i] = &c
	}
	b.mu.Lock()
	b.byTopic[topic] = cp
	b.mu.Unlock()
}

func sameQueues(a, b []*broker.MessageQueue) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].BrokerName != b[i].BrokerName || a[i].QueueId != b[i].QueueId {
			return false
		}
	}
	return true
}

func (b *queueBook) count(topic string) int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.byTopic[topic])
}

// pick returns the queue m's batch goes to: the one its sharding key maps
// to, or the next one in turn for messages without a key; nil when the
// topic's queues are not known yet (the client then picks at random).
func (b *queueBook) pick(m *Message) *broker.MessageQueue {
	b.mu.RLock()
	qs := b.byTopic[m.Destination]
	b.mu.RUnlock()
	if len(qs) == 0 {
		return nil
	}
	i := int(b.rr.Add(1) % uint32(len(qs)))
	if key := ShardingKey(m.Event); key != "" {
		i = queueIndex(key, len(qs))
	}
	q := *qs[i]
	return &q
}
