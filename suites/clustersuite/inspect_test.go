//go:build failpoints

package clustersuite

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
)

// TestInspectEveryBroker: `rmqtx inspect` (package inspect, RemotingLookup
// from the name server alone) shows, for committed events stored on either
// broker, the broker's own record: the half message and the committed
// message, each named with the broker that holds it, and nothing from the
// other broker.
func TestInspectEveryBroker(t *testing.T) {
	t.Parallel()
	eachDB(t, "inspect", func(t *testing.T, b *bed, _ *testbed.Rendezvous) { inspectEveryBroker(t, b) })
}

func inspectEveryBroker(t *testing.T, b *bed) {
	p := b.StartProducer(t, "p1", nil)
	b.StartConsumer(t, "c1")
	ctx := context.Background()
	onBroker := map[string]string{} // broker name -> an event id stored there
	for i := 0; len(onBroker) < 2 && i < 40; i++ {
		id, err := b.SendTxID(ctx, p, false)
		require.NoError(t, err)
		require.True(t, b.Coll.WaitUntil(30*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }))
		if q := b.Coll.Message(id).Queue; q != nil && onBroker[q.BrokerName] == "" {
			onBroker[q.BrokerName] = id
		}
	}
	addr := map[string]string{"broker-a": suite.BrokerA, "broker-b": suite.BrokerB}
	in, err := inspect.New(inspect.Config{DB: b.DB, Broker: inspect.RemotingLookup{NameServers: []string{b.S.NameServer}}})
	require.NoError(t, err)
	for _, name := range []string{"broker-a", "broker-b"} {
		id := onBroker[name]
		require.NotEmpty(t, id, "an event stored on %s", name)
		var v inspect.EventView
		testenv.Eventually(t, 30*time.Second, "the broker's record of "+id, func() bool {
			v, err = in.Event(ctx, id)
			kinds := map[string]bool{}
			for _, m := range v.Broker {
				kinds[m.Kind] = true
			}
			return err == nil && kinds["half"] && kinds["message"]
		})
		require.Empty(t, v.BrokerErrors)
		for _, m := range v.Broker {
			require.Equal(t, addr[name], m.Broker, "%s %s of %s is on %s", m.Kind, m.Topic, id, name)
		}
	}
	b.Sc.Note("inspect found the half and the message of an event on each broker, attributed to it")
	b.Verify(t, 60*time.Second)
}
