// Package broker is rmqtx's one seam to RocketMQ, the mirror of
// internal/dialect on the database side.
//
// Every call into rocketmq-client-go goes through this package tree:
// building the transactional producer, the plain producer and the push
// consumer; the one mapping of send statuses and broker codes
// (broker/brokerclass); the retry topic a push consumer needs; the queue
// selector (broker/rmqroute); the client's logger (broker/rmqlog); the stop
// gate of a push consumer (broker/pushstop); and the protocol calls the
// client offers no API for (broker/remoting). The reflection and unsafe
// reads of the client's internals live here too, each beside a comment that
// names what upstream lacks. Owners (txproducer, consumer, outbox, discard,
// replay, checkback, inspect) use the small types and functions of this
// package and never import the client; imports_test.go enforces it.
//
// The message values (Message, MessageExt, SendResult, ...) are the
// client's own value types, given names here: they are plain data, the
// public API has always accepted them, and an alias keeps every caller's
// code valid. The public API spells the ones it shows through package
// rmqmsg, so no exported signature names an internal type. The behaviour behind the seam is what varies: a test points
// the name servers at rmqtxtest's in-process broker, which speaks the same
// wire protocol, and everything above the wire runs unchanged.
package broker
