//go:build failpoints

package faultsuite

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The restart tests are not parallel: they stop a private service, which
// would break any other scenario running at the same time. Go runs every
// non-parallel top-level test before the parallel ones.

// TestRestartBroker SIGKILLs the private broker while two producer
// instances, an outbox dispatcher and two consumer instances run a load,
// then starts it again. Sends during the outage fail with
// txproducer.ErrSend; afterwards they succeed again; nothing committed is
// lost, nothing rolled back is delivered, nothing is applied twice.
//
// It runs on MariaDB and on PostgreSQL at once (subtests "mysql" and
// "postgres", each with its own bed and load): one kill and one restart of
// the broker hit both beds (testbed.Rendezvous).
func TestRestartBroker(t *testing.T) {
	testenv.Integration(t) // skips under -short
	// Whatever happens, leave the broker running for the next tests.
	suite.KeepUp(t, "broker")
	eachDBShared(t, "broker-restart", func(t *testing.T, b *bed, r *testbed.Rendezvous) {
		restartUnderLoad(t, b, "broker", r,
			func() { suite.MustService(t, "kill9", "broker") },
			func() { suite.MustComeBack(t, "broker") })
	})
}

// TestRestartMariaDB stops and restarts the private MariaDB while the load
// runs. Sends fail with txproducer.ErrDatabase (or ErrCommitUnknown, or
// ErrSend when a check-back could not answer); the txlog decides each one.
// MariaDB only: the fault is the MariaDB server's restart
// (TestRestartPostgreSQL is the same on PostgreSQL).
func TestRestartMariaDB(t *testing.T) {
	testenv.Integration(t)
	suite.KeepUp(t, "mariadb")
	restartUnderLoad(t, newBedOn(t, "mariadb-restart", testenv.DBMySQL), "mariadb", nil,
		func() { suite.MustService(t, "down", "mariadb") },
		func() { suite.MustComeBack(t, "mariadb") })
}

// TestRestartPostgreSQL is TestRestartMariaDB on PostgreSQL, with the
// harsher stop PostgreSQL offers cheaply: immediate (SIGQUIT to the
// postmaster, as `pg_ctl stop -m immediate`), which ends every session
// without a checkpoint, so the restart replays the WAL as after a crash.
// PostgreSQL only: the fault is the PostgreSQL server's crash restart.
func TestRestartPostgreSQL(t *testing.T) {
	testenv.Integration(t)
	suite.KeepUp(t, "postgres")
	var logAt int64
	restartUnderLoad(t, newBedOn(t, "postgres-restart", testenv.DBPostgres), "postgres", nil,
		func() { logAt = suite.StopPostgresImmediate(t) },
		func() {
			suite.MustComeBack(t, "postgres")
			require.Contains(t, suite.PostgresLogSince(t, logAt), "automatic recovery in progress",
				"the restart after an immediate stop replays the WAL, as after a crash")
		})
}

// restartUnderLoad runs a load on b, stops service with fault, and starts
// it again with recover. With r (a fault shared by the beds of every
// database), fault and recover run once, in the last bed to arrive, while
// every bed's load runs.
func restartUnderLoad(t *testing.T, b *bed, service string, r *testbed.Rendezvous, fault, recover func()) {
	step := func(what string, f func()) {
		if r == nil {
			f()
			return
		}
		if !r.Step(f) {
			t.Fatalf("the shared %s of the %s failed in the other database's subtest", what, service)
		}
	}
	p1, p2 := b.StartProducer(t, "p1", nil), b.StartProducer(t, "p2", nil)
	b.StartConsumer(t, "c1")
	b.StartConsumer(t, "c2")
	d := b.StartDispatcher(t, outbox.Config{Name: "obx-" + service, PollInterval: 200 * time.Millisecond, LeaseDuration: 5 * time.Second})

	target := int64(cfg.tx / 4)
	if target < 40 {
		target = 40
	}
	var okAtRecovery int64
	recoveredCh := make(chan struct{})
	minAfter := target / 4
	l := b.StartLoad(testbed.LoadConfig{Producers: []*txproducer.Producer{p1, p2}, Dispatcher: d, OutboxEvery: 10, Workers: cfg.workers,
		Stop: func(l *testbed.Load) bool {
			select {
			case <-recoveredCh:
				return l.N.Load() >= target && l.OK.Load()-okAtRecovery >= minAfter
			default:
				return false
			}
		}})
	t.Cleanup(l.StopAndWait)

	testenv.Eventually(t, 3*time.Minute, "a third of the load before the fault", func() bool { return l.N.Load() >= target/3 && l.OK.Load() > 0 })
	step("stop", fault)
	// The stop is done (in every bed at once when shared): count from here.
	faultAt, errsAtFault, nAtFault := time.Now(), l.Errs.Load(), l.N.Load()
	// The outage must be visible to the producers before the service returns.
	testenv.Eventually(t, 60*time.Second, "errors surfaced by the producers during the outage", func() bool {
		return l.Errs.Load() >= errsAtFault+int64(cfg.workers)
	})
	step("restart", recover)
	outage := time.Since(faultAt)
	errsAtRecovery, nAtRecovery := l.Errs.Load(), l.N.Load()
	okAtRecovery = l.OK.Load()
	close(recoveredCh)
	// Recovery: the load finishes by itself once enough Sends succeed again.
	if !l.Finished(5 * time.Minute) {
		t.Fatalf("the producers did not recover: %d committed Sends after the restart, want %d", l.OK.Load()-okAtRecovery, minAfter)
	}
	recovered := l.OK.Load() - okAtRecovery

	errs := b.SendErrs()
	require.Zero(t, errs["untyped"], "every Send error is one of txproducer's typed errors: %v", errs)
	require.Positive(t, errsAtRecovery-errsAtFault, "the outage surfaced errors")
	switch service {
	case "broker":
		require.Positive(t, errs["ErrSend"], "a broker outage surfaces as txproducer.ErrSend: %v", errs)
	case "mariadb", "postgres":
		require.Positive(t, errs["ErrDatabase"]+errs["ErrCommitUnknown"]+errs["outbox enqueue (database)"], "a database outage surfaces as txproducer.ErrDatabase or ErrCommitUnknown: %v", errs)
	}
	b.Sc.Note("%s stopped, usable again (script returned) %s after the stop: attempts before/in that window/after %d/%d/%d; %d errors during the outage; %d committed after the restart",
		service, outage.Round(100*time.Millisecond), nAtFault, nAtRecovery-nAtFault, l.N.Load()-nAtRecovery, errsAtRecovery-errsAtFault, recovered)
	b.Verify(t, 4*time.Minute)
}
