package hasuite

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txproducer"
)

// TestSlaveKilledUnderLoad SIGKILLs the slave of the replica set while two
// producer instances send transactionally, an outbox dispatcher sends and a
// consumer group (one instance in single mode, one in batch mode) applies,
// so that the master runs without an in-sync replica; then it restarts the
// slave.
//
// The master is a SYNC_MASTER with allAckInSyncStateSet=true: until the
// controller drops the dead slave from the sync state set
// (haMaxTimeSlaveNotCatchup 15 s, checked every 5 s), a put waits for a copy
// that never comes. The broker then answers a stored half with
// FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE, which makes the RocketMQ
// client end it with ROLLBACK itself (rmqtx's ErrForcedRollback), or refuses
// the put (IN_SYNC_REPLICAS_NOT_ENOUGH, an ErrSend). Once the set holds the
// master alone, minInSyncReplicas=1 lets it acknowledge puts alone. The test
// measures the time from the kill to the sync state set of the master
// alone and to the first Send that commits after the kill, and tallies the
// failed Sends per class and RetryAdvice; then the slave comes back and must
// rejoin the sync state set, with the master staying master.
//
// Lost 0, ghosts 0, double effects 0, and each failed Send's RetryAdvice
// fits what happened: never DontRetry, RetryWithSameID for a Send whose
// event committed anyway, and a forced rollback committed nothing
// (checkAdvice). Runs on MariaDB, then on PostgreSQL (testenv.EachDB): one
// kill and one restart per database. Not parallel: it kills a broker.
func TestSlaveKilledUnderLoad(t *testing.T) {
	testenv.Integration(t)
	suite.KeepUp(t, "n0", "n1")
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		slaveLostUnderLoad(t, newBed(t, "slave-killed", db), false)
	})
}

// TestSlaveFrozenUnderLoad is TestSlaveKilledUnderLoad with the slave
// stopped by SIGSTOP instead of killed, then resumed by SIGCONT: its
// connections stay open, so neither the master nor the controller learns
// at once that it is gone (a SIGKILL closes them, and the master drops the
// slave from the sync state set within milliseconds). Puts wait for the
// frozen slave's copy until the controller drops it after
// haMaxTimeSlaveNotCatchup: this is where a SYNC_MASTER answers
// FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE for a stored half and the
// client rolls it back (ErrForcedRollback): the bed's slaveTimeout (2 s)
// is below the client's 3 s send timeout, so the broker answers before the
// client gives up, and at least one Send must fail that way. Same
// assertions and figures otherwise.
func TestSlaveFrozenUnderLoad(t *testing.T) {
	testenv.Integration(t)
	suite.KeepUp(t, "n0", "n1")
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		slaveLostUnderLoad(t, newBed(t, "slave-frozen", db), true)
	})
}

// signalNode sends sig to the JVM of the HA bed's replica n (its pid from
// services.sh's pid file).
func signalNode(t *testing.T, n string, sig syscall.Signal) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(suite.Private(t).RunDir(), "pids", "ha-"+n+".pid"))
	require.NoError(t, err, "the pid file of %s", n)
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	require.NoError(t, err)
	require.Positive(t, pid)
	require.NoError(t, syscall.Kill(pid, sig), "%s to %s (pid %d)", sig, n, pid)
}

// masterAlone matches hastate's last line when the sync state set holds one
// replica only.
var masterAlone = regexp.MustCompile(`syncStateSet=\d+ `)

// slaveLostUnderLoad kills the slave under load (or freezes it, then
// resumes it, with freeze) and restarts it; see TestSlaveKilledUnderLoad.
func slaveLostUnderLoad(t *testing.T, b *Bed, freeze bool) {
	suite.MustService(t, "up", "n0", "n1")
	out, err := suite.HAState("-wait-in-sync", "2", "-timeout", "180s")
	require.NoError(t, err, "both replicas in sync before the kill:\n%s", out)
	master := suite.HAMaster()
	require.NotEmpty(t, master)
	slave := other(master)
	t.Logf("before the kill:\n%s", out)

	p1, p2 := b.StartProducer(t, "p1", nil), b.StartProducer(t, "p2", nil)
	probe := b.StartProducer(t, "probe", nil)
	b.StartConsumer(t, "c1")
	b.StartConsumerWith(t, "c2-batch", func(c *consumer.Config) { c.BatchTransaction, c.BatchSize = true, 8 })
	d := b.StartDispatcher(t, outbox.Config{Name: "obx-ha-slave", PollInterval: 200 * time.Millisecond, LeaseDuration: 5 * time.Second})

	var okAtRejoin int64
	rejoined := make(chan struct{})
	l := b.StartLoad(testbed.LoadConfig{Producers: []*txproducer.Producer{p1, p2}, Dispatcher: d, OutboxEvery: 4, Workers: 3,
		Limiter: rate.NewLimiter(10, 1),
		Stop: func(l *testbed.Load) bool {
			select {
			case <-rejoined:
				return l.OK.Load()-okAtRejoin >= 30
			default:
				return false
			}
		}})
	t.Cleanup(l.StopAndWait)
	testenv.Eventually(t, 90*time.Second, "the load to commit 30 events before the kill", func() bool { return l.OK.Load() >= 30 })

	okAtKill, errsAtKill := l.OK.Load(), l.Errs.Load()
	how := "killed"
	if freeze {
		how = "frozen"
		t.Cleanup(func() { signalNode(t, slave, syscall.SIGCONT) }) // whatever happens
		signalNode(t, slave, syscall.SIGSTOP)
	} else {
		out = suite.MustService(t, "kill9", "slave")
		require.Contains(t, out, "slave is "+slave)
	}
	killedAt := time.Now()

	// The sync state set shrinks to the master alone, seen by the
	// controller (watched beside the probe below).
	alone := make(chan time.Duration, 1)
	go func() {
		for time.Since(killedAt) < 2*time.Minute {
			if masterAlone.MatchString(haState()) {
				alone <- time.Since(killedAt)
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		close(alone)
	}()

	// The first Send that commits after the kill: a probe that sends until
	// one does (each attempt bounded by 10 s, recorded like any Send).
	var firstCommit time.Duration
	probeFailures := 0
	for {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := b.SendTxID(sctx, probe, false)
		cancel()
		if err == nil {
			firstCommit = time.Since(killedAt)
			break
		}
		probeFailures++
		t.Logf("probe Send %d after the kill failed (forced rollback: %t, %s): %v",
			probeFailures, errors.Is(err, txproducer.ErrForcedRollback), txproducer.RetryAdvice(err), err)
		require.Less(t, time.Since(killedAt), 2*time.Minute, "a Send commits within 2 minutes of the kill")
		time.Sleep(200 * time.Millisecond)
	}
	shrink, ok := <-alone
	require.True(t, ok, "the controller left the master alone in the sync state set within 2 minutes of the kill:\n%s", haState())
	require.Equal(t, master, suite.HAMaster(), "the master stays master when its slave dies")
	testenv.Eventually(t, 90*time.Second, "30 more events committed on the master alone", func() bool { return l.OK.Load()-okAtKill >= 30 })
	okAlone, errsAlone := l.OK.Load()-okAtKill, l.Errs.Load()-errsAtKill

	// The slave comes back and rejoins the sync state set.
	restartAt := time.Now()
	if freeze {
		signalNode(t, slave, syscall.SIGCONT)
	} else {
		suite.MustService(t, "up", slave)
	}
	out, err = suite.HAState("-wait-in-sync", "2", "-timeout", "120s")
	require.NoError(t, err, "both replicas in sync after the restart:\n%s", out)
	rejoin := time.Since(restartAt)
	require.Contains(t, out, "master="+master+" ", "the master stays master")
	t.Logf("after the restart:\n%s", out)
	okAtRejoin = l.OK.Load()
	close(rejoined)
	if !l.Finished(2 * time.Minute) {
		t.Fatalf("the load did not finish after the slave rejoined: %d committed since", l.OK.Load()-okAtRejoin)
	}
	b.Sc.Recover = b.Converge(t, 2*time.Minute).Sub(killedAt)

	b.Verify(t, 2*time.Minute)
	advice := checkAdvice(t, b)
	forced := 0
	for _, a := range b.Attempts() {
		if errors.Is(a.Err, txproducer.ErrForcedRollback) {
			forced++
		}
	}
	if freeze {
		// The bed's slaveTimeout (2 s, below the client's 3 s send
		// timeout) makes the master answer FLUSH_SLAVE_TIMEOUT while the
		// frozen slave is in the sync state set: the client rolls those
		// halves back itself, and rmqtx must say so (checkAdvice asserted
		// what each such Send left: nothing committed, no txlog row,
		// RetryWithSameID).
		require.Positive(t, forced, "a Send during the freeze failed with ErrForcedRollback (failed Sends: %s)", advice)
	}
	b.Sc.Note("%s (slave) %s: the master %s alone in the sync state set after %s; first Send committed %s after the kill (%d probe Sends failed first)",
		slave, how, master, shrink.Round(10*time.Millisecond), firstCommit.Round(10*time.Millisecond), probeFailures)
	b.Sc.Note("%d Sends/enqueues committed and %d failed between the kill and the restart; %s back (restarted, or resumed if frozen) and in the sync state set after %s",
		okAlone, errsAlone, slave, rejoin.Round(100*time.Millisecond))
	b.Sc.Note("failed Sends by class and RetryAdvice: %s; discard recovery: %d events (%s)", advice, b.RecoveredIDs(), describeRecovery(b.RecoveryDecisions()))
	t.Logf("FIGURES %s: slave %s %s, master alone after %s, first commit after %s (%d probe failures), rejoin %s, advice %s",
		b.Kind, slave, how, shrink, firstCommit, probeFailures, rejoin, advice)
}
