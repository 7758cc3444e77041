//go:build failpoints

package clustersuite

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// TestBrokerKillStoredCopies is a broker kill as an operator would run it,
// with independent counting: two producer instances of one group send a
// paced load (every 7th local transaction rolls back), broker-b is killed
// with kill -9 and started again, and the load goes on until it committed
// again after the restart.
//
// Lost and ghosts must be 0 (and double effects, Verify asserts them). The
// scenario's own figure is stored>1: how many committed events the
// independent collector received as more than one stored message. The
// broker re-stores an already committed event when it checks its half
// again before the half's "done" marker is written (transactionOpBatchInterval,
// 3000 ms by default, against transactionTimeOut), and discard recovery
// republishes halves the broker gave up while no producer was registered
// with it. Consumers absorb these copies; how many there are depends on the
// broker's settings, so the figure is reported, not asserted. Not parallel:
// it stops a broker.
//
// Batch mode is in the group: c2 consumes with BatchTransaction (the
// messages of a delivered batch share one database transaction). The
// consumers start once the load has committed a backlog, c2 first, so that
// c2 commits batches of several events before c1 joins and the kill comes.
//
// It runs on MariaDB and on PostgreSQL at once (subtests "mysql" and
// "postgres", each with its own bed and load): one kill and one restart of
// broker-b hit both beds.
func TestBrokerKillStoredCopies(t *testing.T) {
	testenv.Integration(t)
	suite.KeepUp(t, "broker-b")
	eachDB(t, "broker-kill-copies", brokerKillStoredCopies)
}

func brokerKillStoredCopies(t *testing.T, b *bed, r *testbed.Rendezvous) {
	p1, p2 := b.StartProducer(t, "p1", nil), b.StartProducer(t, "p2", nil)

	// Per bed, both databases at once: a lighter load than one bed alone.
	const target, before, during, after = 200, 40, 20, 40
	var okAtBack int64
	back := make(chan struct{})
	l := b.StartLoad(testbed.LoadConfig{Producers: []*txproducer.Producer{p1, p2}, Workers: 3, Limiter: rate.NewLimiter(12, 1), RollbackEvery: 7,
		Stop: func(l *testbed.Load) bool {
			select {
			case <-back:
				return l.N.Load() >= target && l.OK.Load()-okAtBack >= after
			default:
				return false
			}
		}})
	t.Cleanup(l.StopAndWait)
	testenv.Eventually(t, 90*time.Second, "the load to commit before the kill", func() bool { return l.OK.Load() >= before })

	// The consumers: c2 in batch mode first, alone with the backlog, then c1.
	var c2Txs testbed.BatchTxs
	b.StartConsumerWith(t, "c2", func(c *consumer.Config) {
		c.BatchTransaction = true
		c.Routes = map[string]consumer.Route{testbed.EventType: {Handler: c2Txs.Wrap(testbed.Handler("c2"))}}
	})
	testenv.Eventually(t, 90*time.Second, "c2 to commit a batch of several events", func() bool { n, _ := c2Txs.Multi(); return n > 0 })
	b.StartConsumer(t, "c1")

	shared(t, r, "kill of broker-b", func() { suite.MustService(t, "kill9", "broker-b") })
	okAtKill, errsAtKill := l.OK.Load(), l.Errs.Load()
	killedAt := time.Now()
	testenv.Eventually(t, 90*time.Second, "Sends to commit on broker-a while broker-b is down", func() bool { return l.OK.Load()-okAtKill >= during })
	okDuringOutage, errsDuringOutage := l.OK.Load()-okAtKill, l.Errs.Load()-errsAtKill

	shared(t, r, "restart of broker-b", func() { suite.MustComeBack(t, "broker-b") })
	backAt := time.Now()
	okAtBack = l.OK.Load()
	close(back)
	if !l.Finished(3 * time.Minute) {
		t.Fatalf("the load did not finish after broker-b came back: %d committed since", l.OK.Load()-okAtBack)
	}
	b.Sc.Recover = b.Converge(t, 3*time.Minute).Sub(backAt)

	errs := b.SendErrs()
	require.Zero(t, errs["untyped"], "every Send error is one of txproducer's typed errors: %v", errs)
	answers, answered := b.CommitAnswers(backAt)
	rec := b.RecoveryDecisions()
	b.Sc.Note("broker-b killed, usable again after %s; %d committed during the outage, %d errors; after the restart %d COMMIT answers to checks for %d events, discard recovery republished %d and fenced %d",
		backAt.Sub(killedAt).Round(100*time.Millisecond), okDuringOutage, errsDuringOutage, answers, answered,
		rec[txlog.RecoveryRepublished], rec[txlog.RecoveryFenced])
	multi, most := c2Txs.Multi()
	b.Sc.Note("c2 (batch mode) committed %d transactions of several events, up to %d", multi, most)
	b.Verify(t, 3*time.Minute)
	t.Logf("stored more than once: %d of %d committed events (reported, not asserted)", b.Sc.StoredTwice, b.Sc.Committed)
}
