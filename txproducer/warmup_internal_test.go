package txproducer

import (
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"
)

type noClient struct{ rocketmq.TransactionProducer }

// heartbeatNow and refreshRoutes reach the pinned client by reflection;
// this test fails when an upgrade of rocketmq-client-go changes that layout
// (warm-up then falls back to waiting for the client's own heartbeat, and
// the broker watcher does not start).
// A client of another shape is left alone.
func TestHeartbeatNowFindsTheClient(t *testing.T) {
	tp, err := rocketmq.NewTransactionProducer(primitive.TransactionListener(nil),
		producer.WithGroupName("rmqtx_heartbeat_layout"),
		producer.WithInstanceName("rmqtx_heartbeat_layout_test"),
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{"127.0.0.1:1"})))
	require.NoError(t, err)
	require.True(t, heartbeatNow(tp), "the client's heartbeat is reachable (nothing registered yet, so nothing is sent)")
	require.True(t, refreshRoutes(tp), "the client's route refresh is reachable (no topics yet, so nothing is asked)")
	require.False(t, heartbeatNow(noClient{}), "another implementation is left alone")
	require.False(t, refreshRoutes(noClient{}))
	require.False(t, heartbeatNow(nil))
	require.False(t, refreshRoutes(nil))
	require.True(t, listsInstance([]string{"10.0.0.1@other", "10.0.0.1@mine"}, "mine"))
	require.True(t, listsInstance([]string{"10.0.0.1@mine@unit"}, "mine"))
	require.False(t, listsInstance([]string{"10.0.0.1@mine2", "mine"}, "mine"))
}
