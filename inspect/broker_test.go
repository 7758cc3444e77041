package inspect_test

import (
	"context"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// A broker that does not answer does not hide what the others hold: the
// lookup returns the messages it found, each with the broker that holds it,
// and an error naming the broker that failed. Every master of the cluster
// is asked for the broker-local half and discard topics.
func TestRemotingLookupEveryBroker(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	id := wire.NewEventID()
	m := primitive.NewMessage(topic, []byte("hello"))
	m.WithProperties(wire.Envelope{EventID: id, EventType: "T"}.Properties([]byte("hello")))
	m.WithKeys([]string{id})
	_, err := testenv.Producer(t).SendSync(context.Background(), m)
	require.NoError(t, err)

	ctx := context.Background()
	dead := "127.0.0.1:1" // nothing listens on port 1
	look := inspect.RemotingLookup{Brokers: []string{dead, s.Broker}, Timeout: 2 * time.Second}
	var got []inspect.BrokerMessage
	testenv.Eventually(t, 30*time.Second, "indexed message", func() bool {
		got, err = look.QueryByKey(ctx, topic, id, 8)
		return len(got) == 1
	})
	require.Error(t, err, "the dead broker's failure is reported")
	require.Contains(t, err.Error(), dead)
	require.Equal(t, s.Broker, got[0].Broker, "each message names the broker that holds it")

	all := inspect.RemotingLookup{NameServers: []string{s.NameServer}}
	got, err = all.QueryByKey(ctx, topic, id, 8)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.Equal(t, s.Broker, got[0].Broker)
	for _, sys := range []string{inspect.HalfTopic, inspect.DiscardTopic} {
		none, err := all.QueryByKey(ctx, sys, id, 8)
		require.NoError(t, err, "%s is asked of every master, whether or not the name server routes it", sys)
		require.Empty(t, none)
	}
}
