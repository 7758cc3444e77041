// Package clustersuite runs rmqtx against a real two-broker RocketMQ
// cluster and prints the figures: nothing lost, nothing ghosted, no double
// effect, and how long recovery took.
//
// It has no API: everything is in its tests, built with the failpoints tag
// (the project's `go test -race -tags failpoints ./...` runs them), on the
// test bed it shares with the fault suite (internal/testbed). TestMain
// starts a PRIVATE MariaDB, PostgreSQL, name server and two master brokers, broker-a and
// broker-b, through scripts/services.sh with RMQTX_BROKERS=2 (its own run
// folder and ports 23307, 29876, 30911 and 31011, and 25433 for the
// PostgreSQL the script starts too, overridable with
// RMQTX_CLUSTERSUITE_MYSQL_PORT, _NAMESRV_PORT, _BROKER_PORT and _PG_PORT;
// broker-b listens 100 above broker-a), so
// killing a broker never disturbs the services other packages test against.
// Both brokers have the test bed's short check settings (transactionTimeOut
// 3 s, check interval 2 s, at most 5 checks); every topic gets 4 queues on
// each. A detached reaper stops the cluster if the test binary dies first.
//
// The scenarios:
//
//   - TestBrokerKilledUnderLoad: broker-b is SIGKILLed while producers, an
//     outbox dispatcher and two consumers run a load, then restarted. Sends
//     fail over to broker-a; halves left on broker-b are decided once it is
//     back; outbox rows pinned to broker-b park in RETRY and are sent later.
//   - TestBrokerKillStoredCopies: the same kill with two producers of one
//     group and every 7th transaction rolled back, counted by an independent
//     consumer: lost and ghosts 0, and how many committed events the broker
//     stored more than once (re-stores after re-checks, republishes), a
//     figure that depends on the broker's settings and is not asserted.
//   - TestChecksAfterProducerRestart: killed producer instances leave halves
//     on both brokers; a new instance that has sent nothing answers both
//     brokers' checks from the txlog.
//   - TestRecoveryOnEitherBroker: halves nobody answers are discarded by
//     each broker into its own TRANS_CHECK_MAX_TIME_TOPIC, and discard
//     recovery resolves them on both.
//   - TestConsumersAcrossBrokers: two consumer instances rebalance over the
//     queues of both brokers; aggregates stay in version order, dedup keeps
//     double effects at 0.
//   - TestWarmupOnEveryBroker and TestInspectEveryBroker: warm-up registers a
//     producer with every broker of its topics, and `rmqtx inspect` finds an
//     event's half, discard and message on whichever broker holds them.
//
// Every scenario runs on MariaDB and on PostgreSQL (parallel subtests
// "mysql" and "postgres", each with its own bed; TestWarmupOnEveryBroker
// through testenv.EachDB). The two broker kills are one fault for both
// databases: both beds run their loads at once, and one kill and one
// restart of broker-b hit both (testbed.Rendezvous). TestBrokerKillStoredCopies
// has a batch-mode consumer (consumer.Config.BatchTransaction) in its group,
// started alone on a backlog so that it commits batches of several events
// before the kill.
//
// Producer instances that must die with a half on a given broker are child
// processes (this test binary re-executed) killed by a failpoint
// (internal/failpoint) right after the local commit or inside the local
// transaction.
//
// Each scenario ends as in the fault suite: convergence, then a marker into
// every queue of both brokers, then the count. A summary table is printed
// after the run (go test shows a passing package's output with -v, or when
// run inside the package folder) and written to
// $TMPDIR/rmqtx-clustersuite-summary.txt (-summary-file). Flags
// after -args: -summary-file PATH, -run-dir DIR and -keep-services (reuse a
// private cluster between runs while debugging).
package clustersuite
