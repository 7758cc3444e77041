package replay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/wire"
)

// TestLifecycleLeakWithTraffic: a Replayer started, a replay run that sends
// its dead letters through the real broker (each consumed by an
// independent collector), and the Replayer closed, three times after a
// warm-up lifecycle: every goroutine the lifecycles started ends, but the
// pool's connections and the client's own leftovers, listed by name
// (testenv.Leftover*). Both databases, one after the other (not parallel:
// it judges every goroutine of the process).
func TestLifecycleLeakWithTraffic(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		s := testenv.Integration(t)
		migrated(t, db)
		topic := testenv.Name(t, "topic")
		testenv.CreateTopic(t, topic, 2)
		col := testenv.Collect(t, topic)
		const perLifecycle = 6
		n := 0
		lifecycle := func() {
			n++
			group := fmt.Sprintf("g-leak-%d", n)
			var ids []string
			for range perLifecycle {
				id := wire.NewEventID()
				insertDeadLetter(t, db, deadLetter{Group: group, Topic: topic, EventID: id})
				ids = append(ids, id)
			}
			r, err := replay.New(replay.Config{DB: db, NameServers: []string{s.NameServer}, Group: testenv.Name(t, "replay"),
				InstanceName: testenv.Name(t, "ri")})
			require.NoError(t, err)
			ctx := context.Background()
			require.NoError(t, r.Start(ctx))
			rep, err := r.Replay(ctx, replay.Request{Selector: replay.Selector{ConsumerGroup: group}, Operator: "ops",
				Reason: "leak check", Batch: 4})
			require.NoError(t, err)
			require.Equal(t, replay.ResultCompleted, rep.Result, "%+v", rep)
			require.Equal(t, perLifecycle, rep.Sent)
			require.True(t, col.WaitUntil(time.Minute, func(s testenv.Snapshot) bool {
				for _, id := range ids {
					if s.Counts[id] == 0 {
						return false
					}
				}
				return true
			}), "the lifecycle's replays are consumed")
			require.NoError(t, r.Close())
		}
		lifecycle() // what a process sets up once is not a leak
		base := testenv.TakeLeakBaseline()
		const lifecycles = 3
		for range lifecycles {
			lifecycle()
		}
		base.AwaitNoLeak(t, "replay", lifecycles, testenv.PoolLeftover(db), testenv.LeftoverLateConnection)
		require.Equal(t, (lifecycles+1)*perLifecycle, col.Snapshot().Distinct(), "every replayed event arrived")
	})
}
