// Package hasuite runs rmqtx against RocketMQ 5's controller mode: one
// replica set (a master and a slave of the same broker name, synchronous
// replication, allAckInSyncStateSet=true) whose master the controller,
// embedded in the name server, replaces when it dies. TestMain is
// suites/internal/testbed's Suite with SuiteConfig.HA: it starts that bed
// with scripts/services.sh (RMQTX_BROKERS=ha) in a run folder and on ports
// of its own (name server 27876, controller 27878, replicas n0 28911 and n1
// 29011; RMQTX_HASUITE_NAMESRV_PORT and RMQTX_HASUITE_BROKER_PORT override
// them) and stops it at the end; the databases are the shared ones of
// testenv, each scenario in a fresh database of its own. The scenarios'
// world (bed, load, verification, summary) is testbed's, as in faultsuite
// and clustersuite.
//
// The scenarios kill the master with SIGKILL, kill the slave, or freeze it
// (SIGSTOP, then SIGCONT) under a load of transactional Sends, outbox
// enqueues and a consumer group, and count with an independent raw
// consumer (testenv.Collector): lost, ghosts and double effects must be 0,
// on MariaDB and on PostgreSQL. Beside them they measure what a failover
// costs: the time to the promotion (or to the sync state set of the master
// alone), to the first committed Send and to the first check answered by
// the promoted master, the Sends that failed and their RetryAdvice, the
// events stored more than once and the halves that reached discard
// recovery. The summary is printed at the end and written to
// $TMPDIR/rmqtx-hasuite-summary.txt (-summary-file).
//
// It is test support only: no library code imports it.
package hasuite
