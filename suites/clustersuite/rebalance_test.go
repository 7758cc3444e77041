//go:build failpoints

package clustersuite

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txproducer"
)

// TestConsumersAcrossBrokers: a consumer group of two instances over a
// topic with queues on both brokers. c1 consumes alone, c2 joins (the
// queues are split between them), then c1 leaves (c2 takes every queue).
// Meanwhile transactional Sends and outbox events of aggregates, each
// aggregate pinned to one queue by the outbox, keep coming. Each instance
// applies events from both brokers; every aggregate's events take effect
// in version order; the duplicates a rebalance redelivers are absorbed by
// the dedup log: double effects 0.
func TestConsumersAcrossBrokers(t *testing.T) {
	t.Parallel()
	eachDB(t, "consumers-rebalance", func(t *testing.T, b *bed, _ *testbed.Rendezvous) { consumersAcrossBrokers(t, b) })
}

func consumersAcrossBrokers(t *testing.T, b *bed) {
	p := b.StartProducer(t, "p1", nil)
	d := b.StartDispatcher(t, outbox.Config{Name: "obx-rebalance", PollInterval: 100 * time.Millisecond, LeaseDuration: 5 * time.Second})
	c1 := b.StartConsumer(t, "c1")

	// Outbox events: 4 aggregates, versions in order, interleaved with the
	// transactional load.
	aggs := make([]string, 4)
	for i := range aggs {
		aggs[i] = fmt.Sprintf("agg-%s-%d", testenv.RandSuffix(6), i)
	}
	var version [4]atomic.Int64
	var stop atomic.Bool
	l := b.StartLoad(testbed.LoadConfig{Producers: []*txproducer.Producer{p}, Workers: 2, Limiter: rate.NewLimiter(12, 1),
		Stop: func(*testbed.Load) bool { return stop.Load() }})
	t.Cleanup(l.StopAndWait)
	aggDone := make(chan struct{})
	go func() {
		defer close(aggDone)
		lim := rate.NewLimiter(8, 1)
		for i := 0; !stop.Load(); i++ {
			if lim.Wait(context.Background()) != nil {
				return
			}
			k := i % len(aggs)
			e := b.OutboxEvent("", aggs[k], version[k].Add(1))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = b.EnqueueOutbox(ctx, e, false, d)
			cancel()
		}
	}()

	total := func(m map[string]int) int { return m["broker-a"] + m["broker-b"] }
	bothAtLeast := func(m map[string]int, n int) bool { return m["broker-a"] >= n && m["broker-b"] >= n }
	testenv.Eventually(t, 90*time.Second, "c1 alone to apply 20 events from each broker", func() bool { return bothAtLeast(b.appliedFrom("c1", 0), 20) })
	joined, mark1 := time.Now(), b.lastEffect(t)
	b.StartConsumer(t, "c2")
	testenv.Eventually(t, 90*time.Second, "c1 and c2 to apply 20 events each after c2 joined", func() bool {
		return total(b.appliedFrom("c1", mark1)) >= 20 && total(b.appliedFrom("c2", mark1)) >= 20
	})
	splitC1, splitC2 := b.appliedFrom("c1", mark1), b.appliedFrom("c2", mark1)
	split := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	require.NoError(t, c1.Shutdown(ctx))
	cancel()
	left, mark2 := time.Now(), b.lastEffect(t)
	testenv.Eventually(t, 90*time.Second, "c2 alone to apply 20 events from each broker", func() bool { return bothAtLeast(b.appliedFrom("c2", mark2), 20) })
	stop.Store(true)
	l.StopAndWait()
	<-aggDone
	converged := b.Converge(t, 2*time.Minute)
	b.Sc.Recover = converged.Sub(left)

	require.Empty(t, b.orderViolations(t), "every aggregate's effects in version order")
	var perAgg int64
	for i := range aggs {
		perAgg += version[i].Load()
	}
	b.Sc.Note("c1 alone, c2 joined after %s, c1 left %s later; while both ran c1 applied %v and c2 %v (events per broker); %d outbox events of %d aggregates applied in version order",
		joined.Sub(b.Started).Round(time.Second), split.Sub(joined).Round(time.Second), splitC1, splitC2, perAgg, len(aggs))
	b.Verify(t, 2*time.Minute)
}

// appliedFrom returns the brokers (by name) whose messages consumer applied
// in effects after the row afterID, using the collector's copy of each event
// to tell where the message was stored.
func (b *bed) appliedFrom(consumer string, afterID int64) map[string]int {
	var ids []string
	if err := b.DB.Select(&ids, b.DB.Rebind("SELECT event_id FROM effects WHERE consumer = ? AND id > ? ORDER BY id"), consumer, afterID); err != nil {
		return nil
	}
	out := map[string]int{}
	for _, id := range ids {
		if m := b.Coll.Message(id); m != nil && m.Queue != nil {
			out[m.Queue.BrokerName]++
		}
	}
	return out
}

// lastEffect returns the id of the newest effects row (0 when none).
func (b *bed) lastEffect(t *testing.T) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.DB.Get(&id, "SELECT COALESCE(MAX(id), 0) FROM effects"))
	return id
}
