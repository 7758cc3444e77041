// Package outbox is rmqtx's polling outbox: an event written in the same
// database transaction as the business change, then delivered by one or more
// dispatchers.
//
// Why a polling outbox beside the transactional producer: events that must
// keep their order per aggregate, sends that must reach normal topics while
// the transactional path is unavailable, and, above all, external side effects
// (HTTP, SMS, payment gateways) that cannot join a database transaction. For
// those, a consumer writes a command row in its own transaction and a
// dispatcher with a FuncSink calls the external system later, passing the
// event id as the idempotency key (the "command outbox"; README "Outbox and
// command outbox").
//
// The life of a row:
//
//	PENDING -> SENT                 (batch sink: a held claim, one write)
//	PENDING -> SENDING -> SENT      (any other sink: owner token and lease)
//	   |          |
//	 RETRY ...  RETRY -> ...
//	   |          |
//	 DEAD       DEAD
//
// Enqueue inserts a PENDING row inside the caller's transaction. With a
// BatchSink (RocketMQSink is one), a Dispatcher's claim is held: SELECT ...
// FOR UPDATE SKIP LOCKED in a transaction that stays open while the rows
// are sent, then each row's outcome (SENT, RETRY, DEAD) is written in that
// transaction, which commits. There is no SENDING state: a crash or a lost
// connection rolls the claim back and the rows are claimable at once, and
// the claim sets the database's idle limit to LeaseDuration, so the server
// ends the transaction of a dispatcher that stopped running (see held.go).
// A held claim keeps one pooled connection of Config.DB until it commits;
// a dispatcher holds at most four claims at once.
// With any other Sink a claim is a short transaction (the same SELECT, then
// UPDATE to SENDING with a fresh owner token and a lease) and the sends
// follow its commit; the outcome is an update conditioned on the owner
// token, so a dispatcher that lost its lease never overwrites the row's
// newer owner, and a row whose lease expired is taken over by any
// dispatcher. Either way, because "the broker has it" and "the row says
// SENT" are two systems, a crash between them sends the event again:
// delivery is at least once and consumers deduplicate by event id.
//
// Throughput: one goroutine claims while Config.Concurrency goroutines send.
// Claimed rows wait in a small buffer bounded by what the senders get
// through well inside the lease, so claims are large and overlap the sends.
// A claim looks for PENDING rows every time; expired leases and due RETRY
// rows once per PollInterval (and again while that look came back full).
// Successful sends are marked SENT in one UPDATE per claim: in the held
// claim's transaction when the sender that finishes its last batch commits
// it, or, with two writes, conditioned on the claim's owner token, when the
// claim's rows are all finished or at most 10ms after the first of them.
// Failures are written row by row. The statements are prepared once per pooled
// connection (internal/stmtcache): one round trip each with any DSN.
//
// Batch sends: when the Sink is a BatchSink (RocketMQSink is), each claim's
// rows are grouped by it and a sender sends one group per request. The
// RocketMQ sink makes one RocketMQ batch per destination topic and target
// queue (the queue a row's sharding key hashes to, as for a single send), at
// most RocketMQConfig.MaxBatchBytes (1 MiB) each; a row too large for that,
// an invalid row, and a keyed row of a topic whose queues it has not seen yet
// go alone. The broker stores a batch whole or not at all, so every row of a
// batch gets the batch's outcome; a batch the broker refuses with an error
// code (above its maxMessageSize, say) is sent again row by row, and each row
// gets its own outcome.
//
// Order per aggregate: a dispatcher only claims the head of an aggregate, the
// row with the lowest aggregate version that is not yet SENT or DEAD. The next
// version becomes claimable once its predecessor is SENT (or DEAD), so any
// number of dispatchers keep the order, and the RocketMQ sink routes every
// version of an aggregate to the same queue.
//
// Errors from a Sink are classified (Permanent, Unknown, Transient): a
// permanent error makes the row DEAD at once; an unknown result or a
// transient error schedules a RETRY with exponential backoff and full jitter,
// up to Config.MaxRetries, after which the row is DEAD. The classes and the
// error type (SendError is errclass.Error) are those the consumer and replay
// use; a send maps the consumer's extra classes onto its own (wait is
// transient, data and conflict are permanent). An error the sink did not
// classify is transient here (a context deadline: unknown), where
// errclass.ClassOf says unknown: the dispatcher keeps its own fallback and
// states it in ClassOf.
package outbox
