package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// TestLifecycleLeakWithTraffic: Start, events handled and committed, and
// Shutdown, four times after a warm-up lifecycle (one at a time, alternately
// in single mode and in batch mode with a shared transaction, one group):
// every goroutine the lifecycles started ends, but the pool's connections
// and the client's own leftovers, listed by name and bounded per lifecycle
// (testenv.Leftover*: the same on the patched and the upstream build). Both databases,
// one after the other (not parallel: it judges every goroutine of the
// process).
func TestLifecycleLeakWithTraffic(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		db = setupDB(t, db)
		topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
		testenv.CreateTopic(t, topic, 2)
		pb := newPublisher(t)
		s := testenv.Integration(t)
		routes := map[string]Route{"Created": {Handler: effectHandler}}
		const events = 10
		n := 0
		lifecycle := func(batch bool) {
			cfg := Config{Group: group, DB: db, Routes: routes, NameServers: []string{s.NameServer}, Topic: topic,
				DelayLevel: func(Class, int) int { return 1 }}
			if batch {
				cfg.BatchSize, cfg.BatchTransaction = 4, true
			}
			c, err := New(cfg)
			require.NoError(t, err)
			require.NoError(t, c.Start(context.Background()))
			for range events {
				n++
				pb.send(topic, ev(wire.NewEventID(), "Created"), []byte(fmt.Sprintf(`{"n":%d}`, n)))
			}
			want := n
			testenv.Eventually(t, 60*time.Second, "the lifecycle's events applied", func() bool { return effects(t, db) >= want })
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, c.Shutdown(ctx))
		}
		lifecycle(false) // what a process sets up once is not a leak
		base := testenv.TakeLeakBaseline()
		const lifecycles = 4
		for i := range lifecycles {
			lifecycle(i%2 == 1)
		}
		base.AwaitNoLeak(t, "consumer", lifecycles, testenv.PoolLeftover(db), testenv.LeftoverStatsSleepers,
			testenv.LeftoverExpiredMsgSleeper, testenv.LeftoverLateConnection)
		require.Equal(t, (lifecycles+1)*events, effects(t, db), "one effect per event")
	})
}
