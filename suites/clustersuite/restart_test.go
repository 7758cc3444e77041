//go:build failpoints

package clustersuite

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txlog"
)

// TestChecksAfterProducerRestart: instances of a producer group are killed
// with halves on both brokers awaiting checks (one per broker killed after
// its local commit, END_TRANSACTION never sent; one killed inside its local
// transaction, no row). A new instance of the group starts and sends
// nothing. Both brokers' checks must reach it and be answered from the
// txlog: COMMIT for the committed halves, ROLLBACK (fenced) for the others,
// each before the broker gives the half up. Lost 0, ghosts 0.
func TestChecksAfterProducerRestart(t *testing.T) {
	t.Parallel()
	eachDB(t, "restart-checks", func(t *testing.T, b *bed, _ *testbed.Rendezvous) { checksAfterProducerRestart(t, b) })
}

func checksAfterProducerRestart(t *testing.T, b *bed) {
	b.StartConsumer(t, "c1")

	jobs := []crashJob{
		{failpoint.AfterLocalCommit, suite.BrokerA}, {failpoint.AfterLocalCommit, suite.BrokerB},
		{failpoint.InsideLocalTx, suite.BrokerA}, {failpoint.InsideLocalTx, suite.BrokerB},
	}
	ids := b.crashAll(t, jobs)

	// The restart: no Send before the checks come.
	restarted := time.Now()
	p := b.StartProducer(t, "restarted", nil)
	final := func(id string) (checkback.Decision, bool) {
		for _, a := range b.Answers(id) {
			if a.Producer == "restarted" && (a.Decision == checkback.Commit || a.Decision == checkback.Rollback) {
				return a.Decision, true
			}
		}
		return checkback.Unknown, false
	}
	if !testenv.Await(60*time.Second, func() bool {
		for _, id := range ids {
			if _, ok := final(id); !ok {
				return false
			}
		}
		return true
	}) {
		for i, id := range ids {
			t.Errorf("%s (%s on %s): answers %v, recovery %v", id, jobs[i].fp, brokerName(jobs[i].broker), b.Answers(id), b.Recovered(id))
		}
		t.Fatalf("the restarted instance did not answer the checks of every half on both brokers within 60 s of its Start")
	}
	b.Sc.Recover = time.Since(restarted)

	ctx := context.Background()
	perBroker := map[string][]checkback.Decision{}
	for i, id := range ids {
		d, _ := final(id)
		row, err := b.Store.Get(ctx, id)
		require.NoError(t, err, "every half has a txlog row once answered")
		if jobs[i].fp == failpoint.AfterLocalCommit {
			require.Equal(t, checkback.Commit, d, "%s on %s: committed before the crash", id, brokerName(jobs[i].broker))
		} else {
			require.Equal(t, checkback.Rollback, d, "%s on %s: no row before the crash, fenced", id, brokerName(jobs[i].broker))
		}
		require.Equal(t, d == checkback.Commit, row.State == txlog.StateCommitted, "the answer is what the txlog says")
		perBroker[brokerName(jobs[i].broker)] = append(perBroker[brokerName(jobs[i].broker)], d)
	}
	require.Len(t, perBroker, 2, "checks from both brokers reached the restarted instance")
	require.Zero(t, b.RecoveredIDs(), "no half was given up by its broker (recovery had nothing to do)")
	b.Sc.Note("halves left by killed instances: %d per broker; answered by the restarted instance: broker-a %v, broker-b %v, all %s after its Start began",
		len(ids)/2, perBroker["broker-a"], perBroker["broker-b"], b.Sc.Recover.Round(100*time.Millisecond))

	// The restarted instance sends as usual.
	for i := 0; i < 10; i++ {
		_ = b.SendTx(ctx, p, i%5 == 4)
	}
	b.Verify(t, 90*time.Second)
}
