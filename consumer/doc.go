// Package consumer turns RocketMQ's at-least-once delivery into an
// exactly-once business effect per consumer group (DESIGN.md I4-I7).
//
// Duplicates are normal: producer retries, double commits, check-back
// commits and lost ACKs all redeliver. For every message the Processor runs
// one local transaction on the service's own database:
//
//	BEGIN
//	INSERT consume_log (group, event id, payload hash)  -- first, one statement
//	  duplicate key, same hash      -> dedup hit: ACK, handler not run
//	  duplicate key, other hash     -> conflict: parked with both hashes, ACK
//	aggregate-version guard (strict: only last+1; monotonic: only newer)
//	  stale                         -> recorded STALE, ACK
//	  gap (strict)                  -> rollback, retry later (bounded), then park
//	handler(ctx, tx, event)         -- the business writes, same tx
//	COMMIT, then ACK
//
// A handler error rolls everything back (no dedup row is left behind) and is
// classified: Transient and unknown errors are retried with RocketMQ delay
// levels up to MaxRetries, Wait errors up to MaxWaits, Permanent and BadData
// errors are parked at once. Failed attempts are counted in their own short
// transaction (the consume_attempt table), so the bound holds across
// instances and restarts. Parked messages go to the dead-letter table with
// topic, queue, offset, msg id, event id, business key, class, error text,
// the payload after the Redact hook and the envelope properties, so a replay
// can re-publish them with their original event id. DeadLetterStore lists and
// resolves them.
//
// Two deliveries of one event at the same moment (two instances, or a
// redelivery racing the first attempt) serialize on the dedup row's key:
// the second waits for the first transaction and then sees a duplicate.
//
// Consumer wires a Processor into a rocketmq-client-go push consumer with its
// own instance name. With BatchSize 1 (the default) a retry uses the
// client's ConsumeRetryLater with the chosen delay level. With BatchSize > 1
// every message still has its own transaction; because the client ignores
// ConsumeConcurrentlyContext.AckIndex and sends a whole batch back on
// ConsumeRetryLater, the messages to retry are re-sent one by one to the
// group's retry topic (%RETRY%<group>) with their delay level by a small
// producer, and the batch is ACKed: committed siblings are not delivered
// again. Only if that re-send fails is the whole batch handed back, and the
// siblings then come back as dedup hits.
//
// Call Migrate (or Processor.Migrate) once before starting; table names take
// a validated prefix, "rmqtx_" by default.
package consumer
