// Package testbed is the one test bed of the fault suite (faultsuite), the
// cluster suite (clustersuite) and the HA suite (hasuite): their private
// services (a whole bed of databases and brokers, or, with SuiteConfig.HA,
// only services.sh's controller-mode replica set beside the shared
// databases), the world one scenario runs in (a fresh database on MariaDB
// or PostgreSQL, a topic, a producer and a consumer group, a load of
// transactional Sends and outbox enqueues), the comparison of the
// database's truth with the consumers' view, and the summary table.
//
// A scenario ends with Bed.Verify: it waits until nothing is owed, then
// sends markers through the scenario's own topic and groups, one to every
// queue, and counts only once each marker was applied and collected, so an
// event that arrives late (a ghost committed after convergence) is counted
// too. The summary says PASS only for a run in which every scenario reached
// the end of Verify with a positive number of committed events. Each
// scenario is reported under its database, with lost, ghosts and double
// effects per database, so one body run on both shows both.
//
// It is test support: only the suites' tests import it, never library code
// (TestLibraryCodeDoesNotImportTestSupport enforces that).
package testbed
