package discard_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
)

// TestLifecycleLeakWithTraffic: a Recovery started, two halves the real
// broker discarded recovered (one republished from its COMMITTED row, one
// fenced), and the Recovery shut down, three times after a warm-up
// lifecycle: every goroutine the lifecycles started ends, but the pool's
// connections and the client's own leftovers, listed by name
// (testenv.Leftover*; a recovery runs two clients, its republish producer
// and its push consumer). Each lifecycle recovers its own producer group's
// halves, all sent before the first lifecycle, so that the broker's
// discard (about 67 s) is waited for once per database. The collector
// counts the republished events once and the fenced ones never. Both
// databases, one after the other (not parallel: it judges every goroutine
// of the process).
func TestLifecycleLeakWithTraffic(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		b := newDiscardBed(t, db)
		const lifecycles = 3
		type halves struct{ group, committed, missing string }
		var hs []halves
		first := b.group
		for i := range lifecycles + 1 {
			if i > 0 {
				// A producer group per lifecycle: a Recovery decides its
				// own group's halves only.
				b.group = fmt.Sprintf("%s-%d", first, i)
				tp, err := rocketmq.NewTransactionProducer(b.l, producer.WithNsResolver(b.s.NameServerResolver()),
					producer.WithGroupName(b.group), producer.WithInstanceName(b.group), producer.WithRetry(2))
				require.NoError(t, err)
				require.NoError(t, tp.Start())
				t.Cleanup(func() { _ = tp.Shutdown() })
				b.tp = tp
			}
			hs = append(hs, halves{group: b.group, committed: b.sendHalf(t, commitRow), missing: b.sendHalf(t, noRow)})
		}
		lifecycle := func(h halves) {
			b.group = h.group
			start := time.Now()
			r, res, _ := b.startRecovery(t, b.store, nil)
			res.wait(t, discardWait, "both halves of "+h.group+" decided", func(all []discard.Result) bool {
				return decided(h.committed, txlog.RecoveryRepublished)(all) && decided(h.missing, txlog.RecoveryFenced)(all)
			})
			t.Logf("%s: both halves decided %s after its recovery started", h.group, time.Since(start).Round(time.Second))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, r.Shutdown(ctx))
		}
		lifecycle(hs[0]) // what a process sets up once is not a leak
		base := testenv.TakeLeakBaseline()
		for _, h := range hs[1:] {
			lifecycle(h)
		}
		// Two clients per lifecycle (the republish producer and the push
		// consumer), each with its own name server connection: on the
		// upstream client both outlive Shutdown (patch 6 closes them).
		base.AwaitNoLeak(t, "discard recovery", lifecycles, testenv.PoolLeftover(db), testenv.LeftoverStatsSleepers,
			testenv.LeftoverExpiredMsgSleeper, testenv.LeftoverLateConnection.Times(2))
		snap := b.settle(t)
		for _, h := range hs {
			require.Equal(t, 1, snap.Counts[h.committed], "the republished event arrived once")
			require.Zero(t, snap.Counts[h.missing], "the fenced event never arrived")
		}
	})
}
