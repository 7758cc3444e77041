// Package conformance holds no code of its own: its tests are one set of
// broker scenarios, written once against a small Backend interface and run
// against every broker rmqtx is tested on, so that the in-process broker of
// package rmqtxtest is held to what the real RocketMQ broker does.
//
// The seam between rmqtx and "a broker" is RocketMQ's remoting protocol:
// the same raw rocketmq-client-go producer, transaction producer and push
// consumer code runs against both backends, and only what a backend must do
// differently to reach a state (restart itself, let the broker check a
// pending half, refuse an unknown topic) is behind the interface. A scenario
// that passes on the fake and fails on the real broker (or the other way
// round) is a difference between them, which is a bug in the fake or a
// wrong belief about the broker.
//
// The backends:
//
//   - real: the broker started by scripts/services.sh (make up), through
//     internal/testenv; the restart and missing-topic scenarios use a
//     private name server and broker (testenv.PrivateBroker, auto-create
//     off) that the test may restart without disturbing other tests.
//   - fake: rmqtxtest.Broker, one per scenario.
//
// The scenarios (TestConformance/<backend>/<scenario>): a half committed or
// rolled back; a check answered COMMIT, ROLLBACK or UNKNOWN; a lost
// END_TRANSACTION; a redelivery after a failed consume; the reconsume limit
// and the dead-letter queue; the order of messages on one queue; a broker
// restart under a live producer and consumer; a send to a missing topic on
// a broker that does not auto-create topics.
//
// Run: eval "$(scripts/services.sh env)"; go test -count=1 -race ./suites/conformance/
// (under -short only the fake backend runs).
package conformance
