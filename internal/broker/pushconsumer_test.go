package broker_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// delivered records what a push consumer's callback and its OnPulled saw.
type delivered struct {
	mu      sync.Mutex
	byKey   map[string]*broker.MessageExt // UNIQ_KEY -> delivered message
	pulled  map[string]bool               // UNIQ_KEYs OnPulled saw
	pullErr string                        // OnPulled saw a message after its delivery
}

func (d *delivered) onPulled(_ broker.MessageQueue, msgs []*broker.MessageExt) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range msgs {
		k := m.GetProperty(broker.PropUniqKey)
		if _, done := d.byKey[k]; done {
			d.pullErr = "OnPulled saw " + k + " after its delivery"
		}
		d.pulled[k] = true
	}
}

func (d *delivered) consume(_ context.Context, msgs ...*broker.MessageExt) (broker.ConsumeResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, m := range msgs {
		d.byKey[m.GetProperty(broker.PropUniqKey)] = m
	}
	return broker.ConsumeSuccess, nil
}

func (d *delivered) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.byKey)
}

// Against the real broker, the seam's two clients together: the plain
// producer sends single messages (a keyed one to wire.QueueFor's queue,
// through the selector) and a batch whose messages each get their own
// UNIQ_KEY; the push consumer delivers every one of them, OnPulled sees
// each before its delivery, and Close (stop gate, then the client's
// Shutdown) returns without error. No database takes part: it runs once.
func TestSeamClientsSendAndDeliver(t *testing.T) {
	s := testenv.Integration(t)
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "cg")
	const queues = 4
	testenv.CreateTopic(t, topic, queues)

	d := &delivered{byKey: map[string]*broker.MessageExt{}, pulled: map[string]bool{}}
	pc, err := broker.NewPushConsumer(broker.PushConsumerConfig{
		Group: group, NameServers: []string{s.NameServer}, InstanceName: group,
		FromWhere: broker.ConsumeFromFirstOffset, BatchSize: 1, MaxReconsumeTimes: 2,
		OnPulled: d.onPulled,
	})
	require.NoError(t, err)
	require.NoError(t, pc.Subscribe(topic, broker.MessageSelector{}, d.consume))
	require.NoError(t, pc.Start())
	closed := false
	t.Cleanup(func() {
		if !closed {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = pc.Close(ctx)
		}
	})

	pgroup := testenv.Name(t, "pg")
	p, err := broker.NewProducer(broker.ProducerConfig{
		NameServers: []string{s.NameServer}, Group: pgroup, InstanceName: pgroup,
		SendTimeout: 3 * time.Second, Retries: 2, Selector: rmqroute.New(),
	})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A keyed single message: the selector puts it on wire.QueueFor's queue.
	keyed := broker.NewMessage(topic, []byte("keyed"))
	keyed.WithShardingKey("Order/42")
	res, err := p.SendSync(ctx, keyed)
	require.NoError(t, err)
	require.NoError(t, broker.CheckSendResult(res))
	require.Equal(t, wire.QueueFor("Order/42", queues), res.MessageQueue.QueueId)
	keyedID := keyed.GetProperty(broker.PropUniqKey)
	require.NotEmpty(t, keyedID, "the client gives a single send its UNIQ_KEY")

	// A batch to one queue: each message gets a UNIQ_KEY of its own, and
	// one set by the caller is kept.
	batch := make([]*broker.Message, 3)
	for i := range batch {
		batch[i] = broker.NewMessage(topic, []byte(fmt.Sprintf("batch %d", i)))
	}
	batch[2].WithProperty(broker.PropUniqKey, "caller-set-"+group)
	res, err = p.SendBatch(ctx, batch)
	require.NoError(t, err)
	require.NoError(t, broker.CheckSendResult(res))
	want := map[string]bool{keyedID: true}
	for _, m := range batch {
		k := m.GetProperty(broker.PropUniqKey)
		require.NotEmpty(t, k)
		require.False(t, want[k], "UNIQ_KEYs are distinct")
		want[k] = true
	}
	require.True(t, want["caller-set-"+group])

	testenv.Eventually(t, 30*time.Second, "every message delivered", func() bool { return d.count() >= len(want) })
	d.mu.Lock()
	for k := range want {
		m, ok := d.byKey[k]
		require.True(t, ok, "delivered %s", k)
		require.True(t, d.pulled[k], "OnPulled saw %s", k)
		if k == keyedID {
			require.Equal(t, wire.QueueFor("Order/42", queues), m.Queue.QueueId)
		}
	}
	require.Len(t, d.byKey, len(want), "nothing else was delivered")
	require.Empty(t, d.pullErr)
	d.mu.Unlock()

	pc.RefreshNow() // on a started client: reaches it (see the internal test) and changes nothing
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	require.NoError(t, pc.Close(cctx))
	closed = true
	require.GreaterOrEqual(t, pc.Discarded(), int64(0))
}

// EnsureRetryTopic creates a group's retry topic on the brokers of its
// subscribed topic (or on the brokers given), leaves an existing one alone,
// and names what stopped it: no route for the subscribed topic, or a broker
// that refused. Against the real broker; no database: it runs once.
func TestEnsureRetryTopic(t *testing.T) {
	s := testenv.Integration(t)
	ns := []string{s.NameServer}
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// On the subscribed topic's brokers, asked from the name server.
	group := testenv.Name(t, "cg")
	retry := broker.RetryTopic(group)
	require.Equal(t, "%RETRY%"+group, retry)
	_, err := remoting.MasterBrokers(ctx, ns, 0, retry)
	require.ErrorIs(t, err, remoting.ErrTopicNotFound, "a new group has no retry topic yet")
	require.NoError(t, broker.EnsureRetryTopic(ctx, broker.RetryTopicSpec{NameServers: ns, Group: group, Topic: topic}))
	brokers, err := remoting.MasterBrokers(ctx, ns, 0, retry)
	require.NoError(t, err)
	require.Equal(t, []string{s.Broker}, brokers)
	require.NoError(t, broker.EnsureRetryTopic(ctx, broker.RetryTopicSpec{NameServers: ns, Group: group, Topic: topic}),
		"an existing retry topic is left alone")

	// On the brokers given, waiting for the name server's route.
	group2 := testenv.Name(t, "cg2")
	require.NoError(t, broker.EnsureRetryTopic(ctx, broker.RetryTopicSpec{NameServers: ns, Group: group2,
		Brokers: []string{s.Broker}, Topic: topic, RouteWait: 10 * time.Second}))
	brokers, err = remoting.MasterBrokers(ctx, ns, 0, broker.RetryTopic(group2))
	require.NoError(t, err, "routed when EnsureRetryTopic returns")
	require.Equal(t, []string{s.Broker}, brokers)

	// The subscribed topic has no route: nothing is created.
	group3 := testenv.Name(t, "cg3")
	err = broker.EnsureRetryTopic(ctx, broker.RetryTopicSpec{NameServers: ns, Group: group3, Topic: testenv.Name(t, "missing")})
	require.ErrorIs(t, err, broker.ErrNoBrokers)
	_, err = remoting.MasterBrokers(ctx, ns, 0, broker.RetryTopic(group3))
	require.ErrorIs(t, err, remoting.ErrTopicNotFound)

	// A broker that cannot be reached: a creation failure, neither of the
	// sentinels, and naming the broker.
	closed := testenv.ClosedAddr(t)
	err = broker.EnsureRetryTopic(ctx, broker.RetryTopicSpec{NameServers: ns, Group: group3, Brokers: []string{closed}, Topic: topic})
	require.Error(t, err)
	require.NotErrorIs(t, err, broker.ErrNoBrokers)
	require.NotErrorIs(t, err, broker.ErrRetryTopicNotRouted)
	require.ErrorContains(t, err, closed)
}
