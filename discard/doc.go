// Package discard recovers the half messages that the broker gave up on.
//
// After transactionCheckMax checks without a COMMIT or ROLLBACK answer (every
// instance of the producer group down, its database unreachable during the
// checks, a broker that could not reach any instance), the broker moves a
// half message to Topic (TRANS_CHECK_MAX_TIME_TOPIC) and never delivers it.
// A Recovery consumes that topic for one producer group and decides each
// message from the txlog row only; the discarded message just names the
// event id and which half it is:
//
//   - COMMITTED, and this is the half that committed: published again as a
//     normal message with the same event id, built from the row (topic,
//     tags, keys, stored properties, payload), on the queue of its
//     aggregate (the row's routing key, as txproducer.Send chose it: WIRE.md,
//     "Queue routing"). Nothing routing-related is taken from the message:
//     once it has been through a consumer retry the broker rewrites its
//     REAL_TOPIC to the recovery group's retry topic. A
//     COMMITTED row without a stored payload (DisablePayloadStorage, a
//     resolver's decision) cannot be republished: it is decided NO_PAYLOAD,
//     logged at Error and counted, and an operator must publish the event;
//   - COMMITTED by another half: dropped (DROPPED). Several halves can carry
//     one event id (a retried Send, two Sends racing); the row records the
//     UNIQ_KEY of the one that committed (checkback.OtherHalf, the rule the
//     check answer applies too), and that half delivers the event. A half
//     whose payload differs from the row's is dropped as CONFLICT;
//   - ROLLED_BACK: dropped;
//   - missing: fenced (a ROLLED_BACK row; its topic is recorded only when
//     the message has not been through a retry) and dropped.
//
// Every decision is logged and counted (rmqtx_checkback_discard_recoveries_total)
// and recorded on the txlog row. A half that did not commit the row is
// recorded there only while the row holds no decision: it never overwrites
// what recovery decided about the half that did.
//
// A message that cannot be decided yet (database or broker unreachable) is
// retried in process, with a jittered backoff doubling from RetryBackoff up
// to RetryMaxBackoff, for as long as it takes: a committed event is never
// given up. Only Shutdown stops the retries; the message then goes back to
// the broker (or stays unacknowledged) for the group's next instance. The
// client's own limits are raised so that they never interfere: max
// reconsume times to the protocol's maximum (the default 16 sent a
// committed event to %DLQ% during a long outage) and the consume timeout to
// 24 h. The gauge rmqtx_checkback_discard_undecided counts the messages held
// meanwhile. Recovery creates its group's retry topic on start, so a message
// handed back is redelivered within seconds, not after the client's 30 s
// route refresh.
//
// Recovery may publish an event twice: it can crash between the republish
// and recording it (failpoint recovery.after-republish), and the next pass
// publishes again. Consumers deduplicate by event id (package consumer).
//
// txproducer starts a Recovery with every Producer unless
// Config.DisableRecovery is set; run one yourself only for a group whose
// producers do not. The metric names keep their checkback_ prefix, where
// recovery used to live, so dashboards and alert rules are unchanged.
// Package checkback answers the broker's checks; see its documentation for
// how FenceAge must fit the broker's check settings.
package discard
