// Package consumer turns RocketMQ's at-least-once delivery into an
// exactly-once business effect per consumer group (invariants I4-I7 in the
// README's "Design and invariants" section).
//
// Duplicates are normal: producer retries, double commits, check-back
// commits and lost ACKs all redeliver. For every message the Processor runs
// one local transaction on the service's own database:
//
//	dedup cache: id committed here with this hash -> dedup hit: ACK, no DB
//	BEGIN
//	INSERT consume_log (group, event id, payload hash)  -- first, one statement
//	  on a duplicate key the existing row is locked and the same statement
//	  says whether its hash is ours (no error, no second query); on
//	  PostgreSQL the insert skips the existing row instead (cheaper for the
//	  new keys that are nearly all of them) and a locking read of its hash
//	  follows
//	  duplicate key, same hash      -> ROLLBACK, dedup hit: ACK, handler not run
//	  duplicate key, other hash     -> ROLLBACK, conflict: parked with both hashes, ACK
//	aggregate-version guard (strict: only last+1; monotonic: only newer)
//	  stale                         -> recorded STALE, ACK
//	  gap (strict)                  -> rollback, retry later (bounded), then park
//	handler(ctx, tx, event)         -- the business writes, same tx
//	COMMIT, then ACK
//
// A handler error rolls everything back (no dedup row is left behind) and is
// classified (errclass.ClassOf): Transient and unknown errors are retried
// with RocketMQ delay levels up to MaxRetries, Wait errors up to MaxWaits,
// Permanent and BadData errors are parked at once. An error the handler did
// not classify is unknown. The classified error type is errclass.Error
// (consumer.Error and outbox.SendError are aliases of it), and any
// errclass.Classified error counts, so a handler returning
// outbox.Permanent(err) is parked, not retried; the outbox reads this
// package's classes the same way. A handler records what it did (an order
// id, a row id) with ev.SetResultRef, in the dedup row and its transaction;
// on an Event no handler is running for, SetResultRef returns
// ErrNotInHandler. Failed attempts are counted in
// their own short transaction (the consume_attempt table), so the bound
// holds across instances and restarts. A success, a stale skip or a dedup
// hit deletes the event's attempt row (the success in its own transaction)
// whenever one may exist: on a retry (ReconsumeTimes > 0), or for an id this
// process saw failing or found in the table at Consumer.Start; without
// crash counting a first delivery of any other id issues no extra statement.
// A handler that ends its process leaves no error, so by default an
// attempt that may follow such a crash is also counted BEFORE its handler
// runs, in its own committed statement (crash.go; two statements per
// counted event, two or three per batch in batch mode,
// ProcessorConfig.NoCrashCount turns it off): past MaxRetries attempts whose
// last one crashed, the message is parked with class crash, not run again.
// A first delivery past its queue's crash-count window is not counted
// (window.go: a read and a committed write per 128 offsets of a queue mark
// where handlers may run), so the first crash of such a message shows as
// the window and parking takes MaxRetries+2 crashes. A copy of an event
// whose attempt runs in the same process is not counted (the mark it would
// see is that live attempt's, not a crash's). Parked messages go to the dead-letter table
// with topic, queue, offset, msg id, event id, business key, class, error
// text, payload hash and the envelope properties. The payload itself is not
// stored unless ProcessorConfig.Redact opts out (KeepPayload, which a
// replay with the original event id needs, or a masking hook).
// DeadLetterStore lists and resolves them.
//
// Duplicates are cheap. Each Processor keeps a bounded cache
// (DedupCacheSize, default 10000) of the (event id, hash) pairs it saw
// committed: its own commits and database dedup hits, never a rolled-back
// attempt. A redelivery found there with the same hash is ACKed with no
// database round trip; another hash always goes to the database, where
// conflicts are decided. A new instance (after a restart or a rebalance) has
// an empty cache: while most of what the database path decides are
// duplicates (48 of the last 64), it first reads the committed dedup row
// outside a transaction (one point read instead of BEGIN, INSERT, ROLLBACK);
// a miss, another hash or an error takes the transaction as usual, so first
// deliveries pay for the read only during such a replay. That read also
// returns the session's isolation level: at READ UNCOMMITTED it could see
// another transaction's uncommitted row, so there it is not trusted and is
// turned off. Every other duplicate decision is a locking statement inside
// the dedup transaction and sees committed rows at any isolation level. The
// statements work with the MySQL driver's flags interpolateParams and
// clientFoundRows.
//
// Two deliveries of one event at the same moment (two instances, or a
// redelivery racing the first attempt) serialize on the dedup row's key:
// the second waits for the first transaction and then sees a duplicate. The
// transaction runs at the sessions' default isolation level, your handler's
// too. On PostgreSQL at REPEATABLE READ or SERIALIZABLE, a statement that
// waited on a row another transaction then committed fails with a
// serialization failure (the row is newer than the transaction's
// snapshot): the second copy is then a retry, delivered again later as a
// duplicate, and likewise an event that waited on an earlier version of its
// aggregate is retried. Nothing is lost or applied twice; READ COMMITTED,
// PostgreSQL's default, decides both at once.
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
// Batch mode (opt-in, Config.BatchTransaction; BatchSize then defaults to
// DefaultBatchTxSize, 16): the messages handed over at once (one queue) share
// one transaction (Processor.ProcessBatch): BEGIN; one multi-row insert of
// their dedup rows that skips existing ones; per event, in order, a SAVEPOINT, the version
// guard and the handler; COMMIT; then the ACK. A failing event is rolled back
// to its savepoint with its dedup row and retried or parked alone; its
// neighbours commit. The insert's row count decides the common cases in one
// statement (all new; all known, whose hashes one locking read returns); a
// batch mixing both is decided per event with the single-mode statement.
// Single and batch mode share their steps: every message is first checked
// the same way, the dedup cache answers known redeliveries, each event runs
// the same guard and handler steps, and one result step turns what the
// transaction decided into the outcome. A crash between the COMMIT and the ACK
// redelivers the batch as dedup hits.
//
// Order: the events of one routing key (wire.RoutingKey: the aggregate,
// else the business key) are applied one after another in the order they
// were pulled from their queue, in single and batch mode; events of other
// keys run in parallel. Senders put one aggregate on one queue (WIRE.md,
// "Queue routing"). A batch transaction holds at most one event per key
// (the rest run in following transactions of the same delivery). An event
// whose earlier event of the same key is being retried is handed back
// behind it, unprocessed. A strict version gap holds nothing back: the
// events behind it run, since the version it waits for may be one of them.
// See serialize.go for the limits.
//
// Every statement of the package is prepared once per pooled connection
// (internal/stmtcache), so each costs one round trip with any DSN.
//
// The package writes its SQL once, portably, and asks the database's dialect
// (internal/dialect) for the few pieces that differ. Create the tables with
// schema.MigrateAll (or `rmqtx migrate`) once before starting; Migrations
// hands it this package's steps. Table names take a validated prefix,
// "rmqtx_" by default.
package consumer
