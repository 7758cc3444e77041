package txproducer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The first Sends of a producer without WarmupTopics to a fresh topic,
// many at once and staggered by microseconds, all commit, and the broker
// stores each event once (the topic's max offset, read independently, is the
// number of Sends). The upstream client fails a half send that arrives
// while another send is recording the topic's route ("topic=... route info
// not found", internal/broker/routerace.go): client patch 9 removes that in
// rmqtx's own build, and the seam waits it out in a service built with the
// upstream client, which is what this test proves in the upstream view.
// One producer, a fresh topic per round: the client learns routes per
// topic.
func TestFirstSendsFindTheRoute(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		s := testenv.Integration(t)
		ctx := context.Background()
		require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
		store, err := txlog.New(db, txlog.DefaultPrefix)
		require.NoError(t, err)
		p := startProducer(t, txproducer.Config{NameServers: []string{s.NameServer}, Group: testenv.Name(t, "pg"),
			DB: db, FenceAge: testFenceAge, CheckTimeout: 10 * time.Second, DisableRecovery: true})
		const rounds, senders, stagger = 20, 32, 5 * time.Microsecond
		for r := 0; r < rounds; r++ {
			topic := fmt.Sprintf("%s_%d", testenv.Name(t, "topic"), r)
			testenv.CreateTopic(t, topic, 1) // one queue: the race is per topic, and a queue holds a broker file open
			failed, first := testenv.StaggeredSends(senders, stagger, func(i int) error {
				res, err := p.Send(ctx, txproducer.Message{Topic: topic, EventType: "RouteProbe",
					AggregateType: "Probe", AggregateID: fmt.Sprintf("p-%d", i), AggregateVersion: 1, Payload: []byte(`{}`)},
					func(context.Context, *sqlx.Tx) error { return nil })
				if err == nil && res.State != txproducer.StateCommitted {
					err = fmt.Errorf("state %s", res.State)
				}
				return err
			})
			require.Zero(t, failed, "round %d: %d of %d first Sends failed, the first with: %v", r, failed, senders, first)
			// The broker stores a committed event when its END arrives (one
			// way), then indexes it.
			stored := testenv.AwaitQueueCount(t, topic, 0, senders, 30*time.Second)
			require.EqualValues(t, senders, stored, "round %d: events stored on the broker", r)
		}
		n, err := store.Count(ctx, txlog.Filter{State: txlog.StateCommitted})
		require.NoError(t, err)
		require.Equal(t, rounds*senders, n, "committed txlog rows")
	})
}
