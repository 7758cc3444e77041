package txproducer

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker"
)

// The seam reaches the pinned client's heartbeat and route refresh by
// reflection; this test fails when an upgrade of rocketmq-client-go changes
// that layout (warm-up then falls back to waiting for the client's own
// heartbeat, and the broker watcher does not start). It lives here, not in
// internal/broker, so that the upstream-client build runs it too (its view
// selects txproducer). A client of another shape: see internal/broker's
// TestTxProducerLeavesAnotherClientAlone.
func TestHeartbeatNowFindsTheClient(t *testing.T) {
	tp, err := broker.NewTxProducer(broker.TxProducerConfig{
		Group: "rmqtx_heartbeat_layout", InstanceName: "rmqtx_heartbeat_layout_test",
		NameServers: []string{"127.0.0.1:1"},
	})
	require.NoError(t, err)
	require.True(t, tp.CanHeartbeat(), "the client behind the producer is found")
	require.True(t, tp.Heartbeat(), "the client's heartbeat is reachable (nothing registered yet, so nothing is sent)")
	require.True(t, tp.RefreshRoutes(), "the client's route refresh is reachable (no topics yet, so nothing is asked)")
	require.True(t, listsInstance([]string{"10.0.0.1@other", "10.0.0.1@mine"}, "mine"))
	require.True(t, listsInstance([]string{"10.0.0.1@mine@unit"}, "mine"))
	require.False(t, listsInstance([]string{"10.0.0.1@mine2", "mine"}, "mine"))
}
