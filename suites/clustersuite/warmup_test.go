//go:build failpoints

package clustersuite

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txproducer"
)

// registeredOn reports whether the broker at addr lists instance among
// group's producers (the channels it sends checks to).
func registeredOn(t *testing.T, addr, group, instance string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := remoting.ProducerConnections(ctx, addr, 5*time.Second, group)
	require.NoError(t, err)
	for _, id := range ids {
		if strings.HasSuffix(id, "@"+instance) {
			return true
		}
	}
	return false
}

// warmupWarnings returns the warnings about warm-up (they name
// WarmupTopics): Start may warn about other things on the same brokers
// (their durability settings, say), which this test is not about.
func warmupWarnings(hook *test.Hook) []*logrus.Entry {
	var out []*logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel && strings.Contains(e.Message, "WarmupTopics") {
			out = append(out, e)
		}
	}
	return out
}

// TestWarmupOnEveryBroker: a producer whose warm-up topic has queues on
// both brokers is registered with both when Start returns, without a
// warning. One whose only warm-up topic lives on broker-a is registered
// there only, and Start names broker-b in a warning: its halves of the
// group would get no answer from this instance until it sends there. It
// runs on both databases (the producer's txlog and its Start checks use
// the database; subtests "mysql" and "postgres").
func TestWarmupOnEveryBroker(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, warmupOnEveryBroker)
}

func warmupOnEveryBroker(t *testing.T, db *sqlx.DB) {
	s := testenv.Integration(t)
	require.NoError(t, schema.MigrateAll(context.Background(), db, ""))
	both := testenv.Name(t, "both")
	testenv.CreateClusterTopic(t, both, 2)

	start := func(group string, topics []string) (*txproducer.Producer, *test.Hook) {
		l, hook := test.NewNullLogger()
		l.SetLevel(logrus.DebugLevel)
		p := testbed.StartProducer(t, txproducer.Config{NameServers: []string{s.NameServer}, Group: group, DB: db,
			FenceAge: testbed.FenceAge, WarmupTopics: topics, DisableRecovery: true, Observe: observe.Observe{Logger: l}})
		return p, hook
	}

	g1 := testenv.Name(t, "pg")
	p1, hook1 := start(g1, []string{both})
	require.True(t, registeredOn(t, suite.BrokerA, g1, p1.InstanceName()), "broker-a lists the instance when Start returns")
	require.True(t, registeredOn(t, suite.BrokerB, g1, p1.InstanceName()), "broker-b lists the instance when Start returns")
	require.Empty(t, warmupWarnings(hook1), "a topic on both brokers covers the cluster")

	onlyA := testenv.Name(t, "onlya")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, remoting.CreateTopic(ctx, suite.BrokerA, 5*time.Second, onlyA, 2))
	testenv.Eventually(t, 30*time.Second, "route of "+onlyA, func() bool {
		r, err := remoting.MasterBrokers(ctx, []string{s.NameServer}, 5*time.Second, onlyA)
		return err == nil && len(r) == 1
	})
	g2 := testenv.Name(t, "pg")
	p2, hook2 := start(g2, []string{onlyA})
	require.True(t, registeredOn(t, suite.BrokerA, g2, p2.InstanceName()), "broker-a lists the instance")
	require.False(t, registeredOn(t, suite.BrokerB, g2, p2.InstanceName()), "broker-b is not in any route the client knows")
	w := warmupWarnings(hook2)
	require.Len(t, w, 1, "one warning, for the master no warm-up topic covers: %v", w)
	require.Equal(t, suite.BrokerB, w[0].Data["broker"])
	require.Contains(t, w[0].Message, "WarmupTopics")
}
