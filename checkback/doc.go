// Package checkback answers RocketMQ's transaction checks for rmqtx
// producers, and recovers half messages the broker gave up on.
//
// A check is answered from the transaction log (package txlog) only, never
// from process memory, so any live instance of the producer group can
// answer for any transaction and every answer after the first decision is
// the same (invariant I3):
//
//   - a row exists: answer its state (COMMITTED -> COMMIT, ROLLED_BACK ->
//     ROLLBACK; a half whose payload hash differs from the row's is not the
//     committed one and is rolled back);
//   - no row, and the half message is younger than the fence age: UNKNOWN,
//     the local transaction may still be running;
//   - no row, and older: fence it (INSERT IGNORE a ROLLED_BACK row, which
//     waits on the row lock of a local transaction still in flight), then
//     answer what the row says. Past the fence age the answer is never
//     UNKNOWN, except when the database cannot be reached in time.
//
// An optional Resolver (a business table as source of truth) is asked when
// no row exists; its decision is persisted before it is answered.
//
// The raw client answers checks one at a time on one goroutine, so every
// query has a timeout and a panic in a resolver is recovered and answered
// UNKNOWN: one slow or broken check never stops the others.
//
// Every read of the txlog (Store.Get) is a read-only READ COMMITTED
// transaction, whatever the server's or the session's default isolation:
// under READ UNCOMMITTED a plain SELECT would see the row of a local
// transaction that may still roll back, and a check would answer COMMIT for
// a ghost. It stays a non-locking point lookup.
//
// # Discard recovery
//
// Recovery watches TRANS_CHECK_MAX_TIME_TOPIC, where the broker moves a half
// message after transactionCheckMax checks, and decides from the txlog row
// only; the discarded message just names the event id:
//
//   - COMMITTED: published again as a normal message with the same event
//     id, built from the row (topic, tags, keys, stored properties,
//     payload). Nothing routing-related is taken from the message: once it
//     has been through a consumer retry the broker rewrites its REAL_TOPIC
//     to the recovery group's retry topic. A COMMITTED row without a stored
//     payload (DisablePayloadStorage, a resolver's decision) cannot be
//     republished: it is decided NO_PAYLOAD, logged at Error and counted,
//     and an operator must publish the event;
//   - ROLLED_BACK: dropped;
//   - missing: fenced (a ROLLED_BACK row; its topic is recorded only when
//     the message has not been through a retry) and dropped.
//
// Every decision is recorded on the txlog row and logged. A message that
// cannot be decided yet (database or broker unreachable) is retried in
// process, with a jittered backoff doubling from RetryBackoff up to
// RetryMaxBackoff, for as long as it takes: a committed event is never
// given up. Only Shutdown stops the retries; the message then goes back to
// the broker (or stays unacknowledged) for the group's next instance. The
// client's own limits are raised so that they never interfere: max
// reconsume times to the protocol's maximum (the default 16 sent a
// committed event to %DLQ% during a long outage) and the consume timeout to
// 24 h. The gauge rmqtx_checkback_discard_undecided counts the messages
// held meanwhile. Recovery creates its group's retry topic on start, so a
// message handed back is redelivered within seconds, not after the
// client's 30 s route refresh.
//
// Recovery may publish an event twice: it can crash between the republish
// and recording it (failpoint recovery.after-republish), and the next pass
// publishes again. Consumers deduplicate by event id (package consumer).
//
// # Fence age and the broker's settings
//
// The broker checks a half message once it is older than transactionTimeOut
// (or CHECK_IMMUNITY_TIME_IN_SECONDS), then once per transactionCheckInterval,
// and discards it after transactionCheckMax checks, i.e. roughly at
//
//	transactionTimeOut + transactionCheckMax x transactionCheckInterval
//
// after it was born. FenceAge must let at least one check arrive after it,
// so that a transaction that never ran is fenced and rolled back by a check
// rather than discarded:
//
//	FenceAge + transactionCheckInterval < transactionTimeOut + (transactionCheckMax-1) x transactionCheckInterval
//
// and FenceAge should exceed the longest local transaction (LocalTxTimeout
// in txproducer), so that fencing normally finds a finished transaction.
// Broker defaults (5.x: 6 s, 30 s, 15) leave about 7 minutes; the library
// default of 60 s fits. The test broker (3 s, 2 s, 5) leaves about 9 s;
// tests use 4 s. Whatever still gets discarded (all instances down, the
// database down during the checks) is caught by Recovery.
package checkback
