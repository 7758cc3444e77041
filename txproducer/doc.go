// Package txproducer publishes a RocketMQ event if, and only if, the
// caller's local database transaction commits (invariants I1 to I3).
//
// Send takes a per-call closure. It validates the message, assigns a stable
// event id (a time-ordered UUIDv7, or the caller's own for retries), puts it
// in a user property and in Keys, and sends a half message. In the client's
// local-transaction callback it begins a transaction, inserts the txlog row
// as the FIRST statement (state COMMITTED, with the payload and its hash),
// runs the closure with the transaction, and commits. An error or a panic in
// the closure rolls back, persists a ROLLED_BACK row, and answers ROLLBACK.
//
// The end-transaction call is one-way and can be lost, so the broker's
// check-back is the real guarantee: every instance answers checks from the
// txlog through package checkback (found: its state; missing and young:
// UNKNOWN; missing and older than FenceAge: fence, then what the row says).
// A half message the broker gives up on is recovered from
// TRANS_CHECK_MAX_TIME_TOPIC (checkback.Recovery, started by Start unless
// disabled).
//
// Traps of the raw client handled here: a unique instance name per
// lifecycle and the producer's own group (clients are shared per instance
// name; a shared one drops checks); panics recovered in both listener
// methods; result.State read, not only err (flush/slave timeouts answer
// ROLLBACK without running the local transaction); warm-up on Start so a
// restarted instance receives checks before its first Send; the client's
// check goroutine, which it never stops, is stopped on Shutdown.
package txproducer
