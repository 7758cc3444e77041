package broker_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// countingListener commits every local transaction and counts the calls.
type countingListener struct{ executed atomic.Int32 }

func (l *countingListener) ExecuteLocalTransaction(*broker.Message) broker.LocalTransactionState {
	l.executed.Add(1)
	return broker.CommitMessageState
}

func (l *countingListener) CheckLocalTransaction(*broker.MessageExt) broker.LocalTransactionState {
	return broker.RollbackMessageState
}

// Against the real broker: the seam's transactional producer sends a half
// and runs the listener for a real message, which is then delivered; a
// warm-up probe is stored, then ended with ROLLBACK by the client without
// the listener (the seam reports it as a flush timeout). No database takes
// part, so it runs once, not on both.
func TestTxProducerProbeRollsBackWithoutTheListener(t *testing.T) {
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	coll := testenv.Collect(t, topic)
	l := &countingListener{}
	group := testenv.Name(t, "group")
	tp, err := broker.NewTxProducer(broker.TxProducerConfig{
		Group: group, InstanceName: group, NameServers: []string{s.NameServer},
		SendTimeout: 3 * time.Second, Retries: 2, Listener: l, ProbeProperty: "RMQTX_TEST_PROBE",
	})
	require.NoError(t, err)
	require.NoError(t, tp.Start())
	t.Cleanup(func() { _ = tp.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	probe := broker.NewMessage(topic, []byte("probe"))
	probe.WithProperty("RMQTX_TEST_PROBE", "1")
	r, err := tp.SendMessageInTransaction(ctx, probe)
	require.NoError(t, err)
	require.Equal(t, broker.SendFlushDiskTimeout, r.Status)
	require.Equal(t, broker.RollbackMessageState, r.State, "the client ends the probe with ROLLBACK")
	require.Zero(t, l.executed.Load(), "the listener never sees a probe")

	event := broker.NewMessage(topic, []byte("event"))
	r, err = tp.SendMessageInTransaction(ctx, event)
	require.NoError(t, err)
	require.Equal(t, broker.SendOK, r.Status)
	require.Equal(t, broker.CommitMessageState, r.State)
	require.EqualValues(t, 1, l.executed.Load())
	snap := coll.WaitDistinct(t, 1, 30*time.Second)
	require.Contains(t, snap.Counts, r.MsgID, "the committed event is delivered")

	// The calls the client lacks reach the started client, and the broker
	// of the topic lists the group's producer after the heartbeat.
	require.True(t, tp.CanHeartbeat())
	require.True(t, tp.RefreshRoutes())
	require.True(t, tp.Heartbeat())
	ids, err := remoting.ProducerConnections(ctx, s.Broker, 3*time.Second, group)
	require.NoError(t, err)
	require.NotEmpty(t, ids, "the broker lists the group's producer")
}

// CreateTopics creates every topic with the queues asked for, and a broker
// that cannot be reached is an error naming the topic.
func TestCreateTopicsCreatesEveryTopic(t *testing.T) {
	s := testenv.Integration(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := testenv.Name(t, "topic_a"), testenv.Name(t, "topic_b")
	require.NoError(t, broker.CreateTopics(ctx, []string{s.NameServer}, s.Broker, 2, a, b))
	for _, topic := range []string{a, b} {
		var route []remoting.RouteBroker
		var err error
		testenv.Eventually(t, 15*time.Second, "the name server routes "+topic, func() bool {
			route, err = remoting.TopicRoute(ctx, []string{s.NameServer}, 3*time.Second, topic)
			return err == nil && len(route) > 0
		})
		require.Len(t, route, 1)
		require.Equal(t, 2, route[0].WriteQueues)
		require.Equal(t, 2, route[0].ReadQueues)
	}

	err := broker.CreateTopics(ctx, []string{s.NameServer}, testenv.ClosedAddr(t), 2, a+"_x")
	require.Error(t, err)
	require.Contains(t, err.Error(), a+"_x")
}

// pendingListener leaves every local transaction unknown (its half stays
// pending) and counts the checks it answers with ROLLBACK.
type pendingListener struct{ checks atomic.Int32 }

func (l *pendingListener) ExecuteLocalTransaction(*broker.Message) broker.LocalTransactionState {
	return broker.UnknownState
}

func (l *pendingListener) CheckLocalTransaction(*broker.MessageExt) broker.LocalTransactionState {
	l.checks.Add(1)
	return broker.RollbackMessageState
}

// HeartbeatBroker registers an instance with a broker that is not in its
// route table (it published nothing, so the client's own Heartbeat sends
// nothing), and the broker's checks then reach the instance over that
// connection: instance A of the group leaves a pending half and shuts down,
// and instance B, registered only by HeartbeatBroker, answers its check.
// This is what the producer's broker watcher relies on for a restarted
// broker the client's routes lost, and for a slave about to be promoted.
// No database takes part, so it runs once, not on both.
func TestHeartbeatBrokerRegistersOffRoute(t *testing.T) {
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	group := testenv.Name(t, "group")
	start := func(instance string, l broker.TxListener) broker.TxProducer {
		tp, err := broker.NewTxProducer(broker.TxProducerConfig{
			Group: group, InstanceName: instance, NameServers: []string{s.NameServer},
			SendTimeout: 3 * time.Second, Retries: 2, Listener: l,
		})
		require.NoError(t, err)
		require.NoError(t, tp.Start())
		return tp
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	b := &pendingListener{}
	tpB := start(group+"_b", b)
	t.Cleanup(func() { _ = tpB.Shutdown() })
	require.True(t, tpB.Heartbeat(), "the client's own heartbeat is reachable")
	ids, err := remoting.ProducerConnections(ctx, s.Broker, 3*time.Second, group)
	require.NoError(t, err)
	require.Empty(t, ids, "B publishes nothing: its own heartbeat reaches no broker")

	tpA := start(group+"_a", &pendingListener{})
	r, err := tpA.SendMessageInTransaction(ctx, broker.NewMessage(topic, []byte("pending")))
	require.NoError(t, err)
	require.Equal(t, broker.UnknownState, r.State, "A's half stays pending")
	require.NoError(t, tpA.Shutdown())

	require.NoError(t, tpB.HeartbeatBroker(ctx, s.Broker))
	ids, err = remoting.ProducerConnections(ctx, s.Broker, 3*time.Second, group)
	require.NoError(t, err)
	require.Len(t, ids, 1, "the broker lists B after HeartbeatBroker")
	require.True(t, strings.HasSuffix(ids[0], "@"+group+"_b"), "the broker lists B (client id ip@instance): %v", ids)
	testenv.Eventually(t, 90*time.Second, "the broker's check of A's half to reach B", func() bool { return b.checks.Load() > 0 })
}
