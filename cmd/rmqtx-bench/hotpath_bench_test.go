package main

import (
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/wire"
)

// In-process hot paths reachable through public APIs, beside
// wire's own benchmarks: what the outbox sink builds per row,
// what the consumer converts per delivery, what a check decodes per request.

func BenchmarkOutboxRocketMQMessage(b *testing.B) {
	m := &outbox.Message{Event: outbox.Event{
		EventID: wire.NewEventID(), EventType: benchEventType, Destination: "bench_topic",
		AggregateType: "Order", AggregateID: "order-000123", AggregateVersion: 2,
		MessageKey: "pay-000123", Payload: makePayload(512, 1),
	}, Attempt: 1}
	b.ReportAllocs()
	for b.Loop() {
		_ = outbox.RocketMQMessage(m)
	}
}

func benchExt() *primitive.MessageExt {
	id := wire.NewEventID()
	payload := makePayload(512, 1)
	ext := &primitive.MessageExt{MsgId: id, QueueOffset: 42}
	ext.Topic, ext.Body = "bench_topic", payload
	ext.WithTag(benchEventType)
	ext.WithKeys([]string{id})
	ext.WithProperties(wire.Envelope{EventID: id, EventType: benchEventType}.Properties(payload))
	return ext
}

func BenchmarkConsumerMessageFromExt(b *testing.B) {
	ext := benchExt()
	b.ReportAllocs()
	for b.Loop() {
		_ = consumer.MessageFromExt(ext)
	}
}

func BenchmarkConsumerDecodeAndHash(b *testing.B) {
	// What Processor.Process does before touching the database.
	msg := consumer.MessageFromExt(benchExt())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := wire.Decode(msg.Properties); err != nil {
			b.Fatal(err)
		}
		_ = wire.Hash(msg.Body)
	}
}

func BenchmarkCheckbackQueryFromMessage(b *testing.B) {
	ext := benchExt()
	b.ReportAllocs()
	for b.Loop() {
		_ = checkback.QueryFromMessage(ext)
	}
}

// BenchmarkQueueSelect is what routing adds to a send: the queue selector
// on a message with a routing key (the FNV-1a hash of the key) and on one
// without (round robin), over the 4 queues of a bench topic.
func BenchmarkQueueSelect(b *testing.B) {
	queues := make([]*primitive.MessageQueue, 4)
	for i := range queues {
		queues[i] = &primitive.MessageQueue{Topic: "bench_topic", BrokerName: "b", QueueId: i}
	}
	for _, keyed := range []bool{false, true} {
		name := "no key"
		env := wire.Envelope{EventID: wire.NewEventID(), EventType: benchEventType}
		if keyed {
			name, env.AggregateType, env.AggregateID, env.AggregateVersion = "aggregate", "Order", "9f8c2b1e-7d4a-4c1e-9b7a-0f3e2d1c4b5a", 1
		}
		b.Run(name, func(b *testing.B) {
			m := primitive.NewMessage("bench_topic", makePayload(512, 1))
			m.WithProperties(env.Properties(m.Body))
			rmqroute.SetKey(m, env)
			sel := rmqroute.New()
			b.ReportAllocs()
			for b.Loop() {
				_ = sel.Select(m, queues, "")
			}
		})
	}
}
