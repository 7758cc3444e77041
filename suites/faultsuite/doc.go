// Package faultsuite tries hard to break rmqtx's promise - nothing lost,
// nothing ghosted, no double effect - and prints the figures.
//
// It has no API: everything is in its tests, built with the failpoints tag
// (the project's test command, `go test -race -tags failpoints ./...`, runs
// them), on the test bed it shares with the cluster suite (internal/testbed).
// TestMain starts a PRIVATE MariaDB, PostgreSQL, name server and broker through
// scripts/services.sh (its own run folder and ports 13307, 19876 and 20911,
// and 15433 for PostgreSQL, overridable with
// RMQTX_FAULTSUITE_MYSQL_PORT, _NAMESRV_PORT, _BROKER_PORT and _PG_PORT),
// points internal/testenv at them, and
// stops them at the end, so the restarts never disturb the services other
// packages test against at the same time. A detached reaper stops them too if
// the test binary dies first (a -timeout panic).
//
// The scenarios:
//
//   - TestRestartBroker: the broker is SIGKILLed and restarted while two
//     producer instances, an outbox dispatcher and two consumers run a load.
//   - TestRestartMariaDB: MariaDB is stopped and restarted under the same load.
//   - TestRestartPostgreSQL: the same on PostgreSQL, stopped immediate (SIGQUIT
//     to the postmaster, as pg_ctl stop -m immediate), so that its restart
//     replays the WAL as after a crash (asserted from the server's log).
//     The three assert that every Send error is one of txproducer's typed
//     errors (ErrSend, ErrDatabase, ErrCommitUnknown, ...), that the outage
//     surfaced such errors, and that Sends commit again afterwards.
//   - TestTornRecordIsDropped: a commit-log record cut short, as a kill -9
//     in the middle of its copy leaves it, is truncated by the broker's
//     recovery instead of being served (the record CRC in broker.conf).
//   - TestCrashMatrix: subprocesses are killed with SIGKILL at every failpoint
//     window (producer: after the half message, inside the local transaction,
//     after the local commit, after END_TRANSACTION; outbox: after a claim,
//     after a send; consumer: after its commit, before its ACK), a number of
//     times each, while a second instance of the same group runs here.
//     Batch mode too (consumer.Config.BatchTransaction): children of a
//     consumer group of its own, which starts with a backlog so that every
//     delivered batch holds several events, are killed in the middle of a
//     batch transaction, after the last handler of a full batch (two
//     events) before its COMMIT, and once a batch of several events
//     committed, before its offset reached the broker; a batch-mode
//     survivor then drains the group, and its own count (every committed
//     event applied once, nothing uncommitted applied) joins the scenario's.
//   - TestDuplicateStorm: every event is published several times to several
//     consumer instances, and processors race on the same message.
//
// TestCrashMatrix, TestDuplicateStorm and TestRestartBroker run their body
// on MariaDB and on PostgreSQL (parallel subtests "mysql" and "postgres",
// each with its own bed; a crash child opens its subtest's database). The
// broker restart is one fault for both: the two beds run their loads at
// once and one kill and one restart hit both (testbed.Rendezvous).
// TestRestartMariaDB and TestRestartPostgreSQL are each about one database
// server's restart and run on that one.
//
// Each scenario ends by waiting until nothing is owed, then sending a marker
// through its own topic and groups into every queue and waiting for each,
// so that a late arrival is counted too. Only then does it compare the
// database's truth (txlog rows, outbox rows, business rows) with the
// consumers' view (business effects, and an independent raw collector), and
// assert lost = 0, ghosts = 0 and double effects = 0; it also reports how
// many committed events were stored more than once. A summary table (a row
// per scenario and database, and lost, ghosts and double effects per
// database) is
// printed after the run (go test shows a passing package's output with -v,
// or when run inside the package folder) and written to
// $TMPDIR/rmqtx-faultsuite-summary.txt (-summary-file). Its verdict is PASS
// only if every scenario finished that verification with committed events.
//
// CI mode is the default (at least 400 transactions, 3 crashes per window;
// about 3 minutes under -race, private services included).
// Soak mode takes flags after -args:
//
//	go test -tags failpoints ./faultsuite -run . -timeout 60m -args -soak -tx 10000 -crashes-per-window 20
//
// Flags: -soak, -tx N (minimum transactions in the load phases), -crashes-per-window
// N, -storm-events N, -workers N, -run-dir DIR and -keep-services (reuse a
// private set between runs while debugging).
package faultsuite
