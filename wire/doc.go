// Package wire is rmqtx's public wire format: the RocketMQ message
// properties, tag and keys that every rmqtx producer writes (txproducer,
// outbox, replay, discard recovery) and that the consumer reads. It exists
// so that services in other languages, Java above all, can produce events
// that rmqtx consumers apply exactly once, and consume rmqtx events without
// reading rmqtx's source. WIRE.md in the repository root documents the same
// rules with Java snippets.
//
// An rmqtx message is a normal RocketMQ message (any client, normal or
// transactional send) whose body is the payload and whose user properties
// carry the envelope:
//
//	RMQTX_FORMAT_VERSION  "1"         always written; absent reads as 1
//	RMQTX_EVENT_ID        required    dedup identity, <= 64 bytes
//	RMQTX_EVENT_TYPE      required    route, <= 128 bytes
//	RMQTX_EVENT_VERSION   "0".."N"    payload schema version, always written
//	RMQTX_AGG_TYPE/_ID    optional    both or neither
//	RMQTX_AGG_VERSION     "0".."N"    with an aggregate; > 0 arms the version guard
//	RMQTX_BIZ_KEY         optional    business key, <= 128 bytes
//	RMQTX_PAYLOAD_SHA256  optional    hex SHA-256 of the body, any case on read
//	rmqtx.h.<name>        optional    user headers
//
// rmqtx also sets the RocketMQ tag to the event type when the caller sets no
// tag, so tag filters select by type, and writes the event id as the last of
// the message keys (Keys), so queryMsgByKey finds it.
//
// Compatibility: FormatVersion changes only for a change that a reader of
// the previous version would misread. New optional properties do not change
// it, and readers ignore properties they do not know. A reader that meets a
// newer format rejects the message with ErrUnsupportedFormat (the consumer
// parks it as a dead letter, replayable once the reader is upgraded) rather
// than guess.
//
// Messages written by clients that know nothing of this format can still be
// consumed: the consumer's adoption option (consumer.Adoption) takes the
// event id from a named property, the message keys or UNIQ_KEY, and the
// type from the tag. WIRE.md explains what each choice means for dedup.
package wire
