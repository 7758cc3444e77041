package txproducer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txproducer"
)

// producerLeftovers are the goroutines a producer's lifecycle may leave
// behind on this client build. The upstream client's transactional
// producer ranges over a channel that nothing closes, so its check
// goroutine outlives Shutdown, one per lifecycle (patch 2 of
// third_party/rocketmq-client-go/PATCHES.md ends it; TestLifecycleLeak
// bounds what it retains). The patched client leaves nothing.
func producerLeftovers(t *testing.T) []testenv.Leftover {
	if patchedClient(t) {
		return nil
	}
	return []testenv.Leftover{{Func: "checkTransactionState", PerLifecycle: 1,
		Why: "upstream client: the transactional producer's check loop ranges over a channel Shutdown never closes"}}
}

// TestLifecycleLeakWithTraffic: Start, sends that commit and are consumed,
// and Shutdown, three times after a warm-up lifecycle: every goroutine the
// lifecycles started ends (the pool's connections and the client's known
// leftovers aside, listed by name: producerLeftovers, testenv.Leftover*).
// Discard recovery is off here: discard's own TestLifecycleLeakWithTraffic
// checks it with real discarded halves. Both databases, one
// after the other (not parallel: it judges every goroutine of the process).
func TestLifecycleLeakWithTraffic(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		b := setupOn(t, db, 2)
		cfg := b.config()
		const sends = 10
		ctx := context.Background()
		n := 0
		lifecycle := func() {
			p, err := txproducer.New(cfg)
			require.NoError(t, err)
			require.NoError(t, p.Start(ctx))
			var ids []string
			for range sends {
				n++
				id := fmt.Sprintf("leak-%d", n)
				res, err := p.Send(ctx, b.msg(id), insertOrder(id))
				require.NoError(t, err)
				require.Equal(t, txproducer.StateCommitted, res.State)
				ids = append(ids, id)
			}
			require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool {
				for _, id := range ids {
					if s.Counts[id] == 0 {
						return false
					}
				}
				return true
			}), "the lifecycle's events are consumed")
			require.NoError(t, p.Shutdown(ctx))
		}
		lifecycle() // what a process sets up once is not a leak
		base := testenv.TakeLeakBaseline()
		const lifecycles = 3
		for range lifecycles {
			lifecycle()
		}
		base.AwaitNoLeak(t, "txproducer", lifecycles, append(producerLeftovers(t), testenv.PoolLeftover(db), testenv.LeftoverLateConnection)...)
		s := b.coll.Snapshot()
		require.Equal(t, (lifecycles+1)*sends, s.Distinct(), "every committed event arrived")
	})
}
