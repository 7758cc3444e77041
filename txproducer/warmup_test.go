package txproducer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// When Start returns, every broker of the warm-up topics already lists the
// instance among the group's producers (the channels it sends checks to):
// no check of an older transaction has to wait for the client's periodic
// heartbeat. Warm-up logs no warning on the single-broker bed, where the
// topic covers the only master. (The cluster suite checks both brokers of
// a two-broker cluster, and the warning for a master no topic covers.)
func TestWarmupRegistersBeforeStartReturns(t *testing.T) {
	t.Parallel()
	b := setup(t, 2)
	l, hook := captureLogger()
	cfg := b.config()
	cfg.Logger = l
	p := startProducer(t, cfg)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := remoting.ProducerConnections(ctx, b.s.Broker, 5*time.Second, b.group)
	require.NoError(t, err)
	found := false
	for _, id := range ids {
		found = found || strings.HasSuffix(id, "@"+p.InstanceName())
	}
	require.True(t, found, "the broker lists instance %s for group %s right after Start: %v", p.InstanceName(), b.group, ids)
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			require.NotContains(t, e.Message, "warm-up", "a healthy warm-up warns about nothing: %v", e.Data)
			require.NotContains(t, e.Message, "WarmupTopics", "a healthy warm-up warns about nothing: %v", e.Data)
		}
	}
	require.Len(t, testenv.Masters(t), 1, "the shared bed has one master")
}
