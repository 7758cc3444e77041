package broker

import (
	"context"
	"errors"
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/stretchr/testify/require"
)

// noClient is a TransactionProducer of another shape than the client's.
type noClient struct{ rocketmq.TransactionProducer }

// On a producer whose layout is not the pinned client's (another
// implementation, or none), the calls the client lacks do nothing and say
// so; the layout of the real client is TestHeartbeatNowFindsTheClient
// (txproducer), which the upstream-client build runs too.
func TestTxProducerLeavesAnotherClientAlone(t *testing.T) {
	for name, tp := range map[string]rocketmq.TransactionProducer{"other": noClient{}, "nil": nil} {
		p := txProducer{TransactionProducer: tp, group: "g"}
		require.False(t, p.CanHeartbeat(), name)
		require.False(t, p.Heartbeat(), name)
		require.False(t, p.RefreshRoutes(), name)
		require.ErrorIs(t, p.HeartbeatBroker(context.Background(), "127.0.0.1:1"), ErrNoHeartbeat, name)
	}
}

// A stored probe is reported as a flush timeout, so the client ends it with
// ROLLBACK without the listener; anything else passes through as it was.
func TestProbeRollbackReportsStoredProbesAsFlushTimeout(t *testing.T) {
	const prop = "RMQTX_TEST_PROBE"
	intercept := probeRollback(prop)
	send := func(m *Message, status SendStatus, sendErr error) (SendStatus, error) {
		r := &SendResult{}
		err := intercept(context.Background(), m, r, func(_ context.Context, req, reply any) error {
			reply.(*SendResult).Status = status
			return sendErr
		})
		return r.Status, err
	}
	probe := func() *Message {
		m := NewMessage("t", []byte("probe"))
		m.WithProperty(prop, "1")
		return m
	}

	st, err := send(probe(), SendOK, nil)
	require.NoError(t, err)
	require.Equal(t, SendFlushDiskTimeout, st, "a stored probe")

	st, err = send(NewMessage("t", []byte("event")), SendOK, nil)
	require.NoError(t, err)
	require.Equal(t, SendOK, st, "a real send is untouched")

	st, err = send(probe(), SendSlaveNotAvailable, nil)
	require.NoError(t, err)
	require.Equal(t, SendSlaveNotAvailable, st, "a probe the broker did not store OK keeps its status")

	failed := errors.New("send failed")
	_, err = send(probe(), SendOK, failed)
	require.ErrorIs(t, err, failed, "a failed probe stays an error")
}
