// Package replay re-publishes parked dead letters (consumer package) to
// their original topic, safely (invariant I8):
//
//   - Identity: each message keeps its ORIGINAL event id, payload and
//     envelope properties, so it passes through the consumer's dedup like any
//     redelivery. Replay metadata travels in extra properties starting with
//     envelope.PropReplayPrefix (PropAuditID, PropOperator, PropCount, ...).
//     A dead letter has no consume-log row (its handler never committed), so
//     the first replay of a fixed message applies once; replaying it again is
//     a dedup hit, never a second effect. It goes to the queue of its
//     aggregate (else business key), the queue its original sender chose
//     (WIRE.md, "Queue routing"), so the consumer applies it in turn with
//     the aggregate's events sent after it, never beside them.
//   - Pacing: messages go out in small batches under a token-bucket rate limit
//     (golang.org/x/time/rate, burst 1). After every batch the replayer counts
//     dead letters parked since it started; once they reach
//     Config.StopAfterNewDeadLetters it stops by itself (a replay that makes
//     new dead letters is flooding a downstream that has not recovered).
//   - Audit: every run writes a <prefix>replay_audit row (operator, reason,
//     scope as JSON, selected/sent/failed/skipped counts, start, end, result)
//     and one <prefix>replay_audit_item row per dead letter it touched.
//   - Exclusion: each dead letter is replayed in its own short transaction
//     that locks its row (SELECT ... FOR UPDATE), sends, then marks it
//     REPLAYED (replay_count+1, replayed_at). Two replayers never send the
//     same row twice, and a consumer that parks the replayed message again
//     waits for that commit, so its PARKED status is never overwritten.
//
// DryRun shows what a Replay with the same Selector would do, without
// sending or writing anything.
//
// A replay goes to the original topic, so every consumer group subscribed to
// it receives the message again; groups that already applied the event see a
// dedup hit. Dead letters whose payload was redacted when parked, and
// payload-hash conflicts (which would only be parked again), are skipped and
// reported as such.
package replay
