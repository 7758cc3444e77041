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
// The end-transaction call can be lost (the client's is one-way; a Send with
// a business key or an aggregate ends its own transaction with a request
// the broker answers, to keep the order per key: endsync.go), so the
// broker's check-back is the real guarantee: every instance answers checks from the
// txlog through package checkback (found: its state; missing and young:
// UNKNOWN; missing and older than FenceAge: fence, then what the row says).
// A half message the broker gives up on is recovered from
// TRANS_CHECK_MAX_TIME_TOPIC (discard.Recovery, started by Start unless
// disabled). Start compares FenceAge with the brokers' check settings.
//
// One event id, one copy. Several half messages can carry one event id (a
// retry after ErrCommitUnknown, duplicate requests racing, a retry after a
// crash). The row records the UNIQ_KEY of the half that committed; every
// other half is answered ROLLBACK, by its own Send and by any check, and
// that Send reports the event as committed with Result.Duplicate set. A
// supplied id is not looked up first: a Send of an id that already has a
// row sends its own half too, and its local transaction, finding the row at
// its first statement, answers that half ROLLBACK (`rmqtx inspect` shows
// both halves) and reports the row's outcome.
//
// Retries: a failed Send does not spend its event id. When the id's row
// records a rollback (the caller's function failed, the database or the
// broker failed, a check fenced the half), a later Send with the same id
// takes the row over (txlog.Store.Retake): its half becomes the one the row
// names, and every older half of the id is answered ROLLBACK by any check
// and dropped by discard recovery. A check that fenced a half past
// FenceAge makes sure that half's own Send can never take the id over
// after. A committed id stays final: sending it again returns Duplicate.
// So an id derived from a business key can be retried after any ordinary
// failure; RetryAdvice says which failures to retry at all.
//
// Traps of the raw client handled here: a unique instance name per
// lifecycle and the producer's own group (clients are shared per instance
// name; a shared one drops checks); panics recovered in both listener
// methods; result.State read, not only err (flush/slave timeouts answer
// ROLLBACK without running the local transaction); warm-up on Start so a
// restarted instance receives checks before its first Send, with probes the
// client rolls back itself (answered from the listener, it logs each one as
// an ERROR) and a heartbeat to every broker of the warm-up topics right
// after them (the client's own comes 1 s after Start, then every 30 s; a
// warm-up that ended later left the instance unknown to the brokers for
// 30 s); a heartbeat to a broker that restarts, as soon as it accepts
// connections again (a restarted broker knows no producer, and the client
// heartbeats only every 30 s; see Config.BrokerWatchInterval). The upstream client never stops its check goroutine (one goroutine
// per producer lifecycle); rmqtx no longer closes the client's private
// channel by reflection, which raced with a check being handed over. The
// patched client in third_party/rocketmq-client-go (PATCHES.md, patch 2)
// stops it on Shutdown; with the upstream client one idle goroutine stays
// per Start/Shutdown cycle.
package txproducer
