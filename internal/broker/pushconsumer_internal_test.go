package broker

import (
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/stretchr/testify/require"
)

// The reflection behind RefreshNow finds the pinned client's internal
// RMQClient, with the three methods it calls: if an upgrade of the client
// changes its layout, this fails instead of RefreshNow silently doing
// nothing (a consumer started before its topic would then wait for the
// client's own timers). Building a push consumer does not connect.
func TestPushClientFindsTheClient(t *testing.T) {
	pc, err := NewPushConsumer(PushConsumerConfig{Group: "rmqtx_seam_unit", NameServers: []string{"127.0.0.1:1"},
		InstanceName: "rmqtx-seam-unit-" + t.Name(), BatchSize: 1})
	require.NoError(t, err)
	c := pushClient(pc.(*pushConsumer).pc)
	require.NotNil(t, c)
	_, ok := c.(interface {
		UpdateTopicRouteInfo()
		SendHeartbeatToAllBrokerWithLock()
		RebalanceIfNotPaused()
	})
	require.True(t, ok, "the client has the methods refreshNow calls")
	require.NoError(t, pc.Shutdown()) // never started
}

// otherPush is a PushConsumer of another shape than the client's.
type otherPush struct{ rocketmq.PushConsumer }

// On a push consumer whose layout is not the pinned client's, or none,
// refreshNow does nothing and does not panic.
func TestRefreshNowLeavesAnotherClientAlone(t *testing.T) {
	for name, pc := range map[string]rocketmq.PushConsumer{"other": otherPush{}, "nil": nil} {
		t.Run(name, func(t *testing.T) {
			require.Nil(t, pushClient(pc))
			require.NotPanics(t, func() { refreshNow(pc) })
		})
	}
}
