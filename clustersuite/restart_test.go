//go:build failpoints

package clustersuite

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/failpoint"
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
	b := newBed(t, "restart-checks")
	b.startConsumer(t, "c1")

	jobs := []crashJob{
		{failpoint.AfterLocalCommit, brokerA}, {failpoint.AfterLocalCommit, brokerB},
		{failpoint.InsideLocalTx, brokerA}, {failpoint.InsideLocalTx, brokerB},
	}
	ids := b.crashAll(t, jobs)

	// The restart: no Send before the checks come.
	restarted := time.Now()
	p := b.startProducer(t, "restarted", nil)
	final := func(id string) (checkback.Decision, bool) {
		for _, a := range b.answeredBy(id) {
			if a.producer == "restarted" && (a.decision == checkback.Commit || a.decision == checkback.Rollback) {
				return a.decision, true
			}
		}
		return checkback.Unknown, false
	}
	if !eventually(60*time.Second, func() bool {
		for _, id := range ids {
			if _, ok := final(id); !ok {
				return false
			}
		}
		return true
	}) {
		b.mu.Lock()
		for i, id := range ids {
			t.Errorf("%s (%s on %s): answers %v, recovery %v", id, jobs[i].fp, brokerName(jobs[i].broker), b.answers[id], b.recovered[id])
		}
		b.mu.Unlock()
		t.Fatalf("the restarted instance did not answer the checks of every half on both brokers within 60 s of its Start")
	}
	b.sc.Recover = time.Since(restarted)

	ctx := context.Background()
	perBroker := map[string][]checkback.Decision{}
	for i, id := range ids {
		d, _ := final(id)
		row, err := b.store.Get(ctx, id)
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
	b.mu.Lock()
	discarded := len(b.recovered)
	b.mu.Unlock()
	require.Zero(t, discarded, "no half was given up by its broker (recovery had nothing to do)")
	b.sc.note("halves left by killed instances: %d per broker; answered by the restarted instance: broker-a %v, broker-b %v, all %s after its Start began",
		len(ids)/2, perBroker["broker-a"], perBroker["broker-b"], b.sc.Recover.Round(100*time.Millisecond))

	// The restarted instance sends as usual.
	for i := 0; i < 10; i++ {
		_ = b.sendTx(ctx, p, i%5 == 4)
	}
	b.verify(t, 90*time.Second)
}
