// Package rmqtxtest runs an in-process RocketMQ name server and broker for
// tests, on 127.0.0.1, speaking the real remoting protocol: every rmqtx
// component (txproducer, consumer, outbox's RocketMQSink, discard recovery,
// replay) and the raw rocketmq-client-go run against it unchanged, given
// Broker.NameServers() where they would take the real name server. Nothing
// is mocked above the wire, so a test sees the client's own behaviour
// (listener calls, retries, rebalance, send-back).
//
// The broker is deterministic where the real one runs on timers:
// transaction checks run when the test asks (CheckNow) or when the test
// moves the broker's clock past a half's check time (Advance), and a
// message sent back by a consumer is redelivered at once unless
// Options.KeepRetryDelays. The clients keep their own timers; a
// long-polling pull is answered as soon as a message arrives, so a
// delivery takes milliseconds.
//
// Faults are injected per request (LoseEndTransaction, FailNextSend,
// StatusNext, FailNextPull, DuplicateNext, Hold and Release, Redeliver,
// DiscardHalves, Restart) and the store is inspected directly (Messages,
// WaitMessages, Pending, RolledBack, DeadLetters).
//
// NewProducer, NewConsumer, NewSink and NewDispatcher build the real rmqtx
// components on a Broker and the test's own database, started, and shut
// down in t.Cleanup; they shorten only the defaults sized for a production
// broker that would make a test wait (the Kit* constants say why).
//
// It is one broker with one master, keeps everything in memory and never
// deletes a message. It does not implement ACL, SQL92 filters (every
// message matches), VIEW_MESSAGE_BY_ID, or delayed messages sent by
// producers (they are delivered at once). The suite in suites/conformance
// runs the same scenarios on it and on a real broker, so the two cannot
// drift apart unnoticed.
package rmqtxtest
