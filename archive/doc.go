// Package archive removes terminal rows from rmqtx's tables once they are
// past their retention, so the tables do not grow forever, and never touches
// in-flight work (invariant I9).
//
// # What is removed
//
//	table          removed when                                         never removed
//	txlog          state COMMITTED/ROLLED_BACK, resolved_at < cutoff     (no in-flight state exists)
//	outbox         status SENT, updated_at < cutoff                      PENDING, SENDING, RETRY
//	               status DEAD, updated_at < dead cutoff
//	consume_log    status SUCCESS/STALE, updated_at < cutoff              any other status
//	dead_letter    status REPLAYED/DISCARDED, resolved_at (or            PARKED
//	               replayed_at) AND last_seen_at < cutoff
//
// consume_attempt (retries in progress), aggregate_version (the version
// guard's state) and replay_audit (the audit trail) are never touched.
//
// Work goes in bounded batches: a batch selects at most Batch primary keys
// (oldest first), then in one short transaction locks those rows again WITH
// THE SAME PREDICATE (SELECT ... FOR UPDATE), optionally copies the locked rows
// to <table>_archive (Move), and deletes exactly them. A row that changed
// state between the two steps (a dead letter parked again, an outbox row
// re-driven) fails the predicate and stays. Plan (dry run) counts what Run
// would remove.
//
// # Retention defaults and why they are safe
//
// Production broker defaults: transactionTimeOut 6s, transactionCheckInterval
// 30s, transactionCheckMax 15, so the broker may check a half message for
// about 6s + 15 x 30s = 7.5 minutes (the test bed: 3s + 32 x 2s = 67s), after
// which the half message is discarded and rmqtx's discard recovery reads the
// txlog row to re-publish or drop it. The broker keeps messages for
// fileReservedTime (default 72h); a consumer may see any of them again (a
// lost ACK, an offset reset, a replay) while they exist.
//
//   - txlog: 7 days (at least txlog.MinRetention, 24h). A row must outlive the
//     check window and the discard recovery (minutes); 7 days is three orders
//     of magnitude above it and leaves a working week for an incident review.
//     Deleting a COMMITTED row earlier would let a late check fence a
//     committed event (I1/I3).
//   - outbox SENT: 7 days (at least 1h). Once SENT the broker holds the
//     message and consumers dedup on their own log; the row only serves
//     inspection. DEAD: 30 days (at least 24h), so an operator can re-drive it.
//   - consume_log: 30 days (at least 72h, the broker's message retention).
//     A dedup row must outlive every possible redelivery of its event: the
//     consumer's retry window (MaxRetries/MaxWaits delay levels, at most a few
//     hours), the broker's retention (72h) and the replay window (dead
//     letters are kept 30 days and can be replayed again while they exist).
//     Hence ConsumeLogRetention >= DeadLetterRetention is enforced: a dead
//     letter replayed on its last day still meets its dedup row.
//   - dead_letter REPLAYED/DISCARDED: 30 days after resolution (at least 24h)
//     and after its last delivery. PARKED ones wait for an operator forever.
//
// Shorter retentions than the minimums are refused (ErrRetentionTooShort);
// tests and unusual deployments can lower them with AllowShortRetention.
package archive
