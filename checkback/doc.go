// Package checkback answers RocketMQ's transaction checks for rmqtx
// producers.
//
// A check is answered from the transaction log (package txlog) only, never
// from process memory, so any live instance of the producer group can
// answer for any transaction and every answer after the first decision is
// the same (invariant I3):
//
//   - a row exists: answer its state (COMMITTED -> COMMIT, ROLLED_BACK ->
//     ROLLBACK). A half that is not the one that committed is rolled back:
//     the row records the committed half's UNIQ_KEY (OtherHalf), and a half
//     whose payload hash differs from the row's cannot be it either;
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
// A half message the broker gives up on (after transactionCheckMax checks)
// is not answered here: package discard recovers it from the txlog. Both
// apply the same rule to a half that did not commit its row (OtherHalf).
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
// database down during the checks) is caught by discard recovery (package
// discard).
package checkback
