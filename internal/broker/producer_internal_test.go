package broker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/stretchr/testify/require"
)

// routeRaceProducer fails its first noRoute sends as the client does when a
// concurrent first send to the topic won its route-cache race.
type routeRaceProducer struct {
	rocketmq.Producer
	noRoute, calls int
	err            error // nil: the client's route error
}

func (p *routeRaceProducer) SendSync(context.Context, ...*Message) (*SendResult, error) {
	p.calls++
	if p.calls <= p.noRoute {
		if p.err != nil {
			return nil, p.err
		}
		return nil, errors.New("topic=t route info not found")
	}
	return &SendResult{Status: SendOK}, nil
}

// A send that met the client's route race waits for the route update in
// progress (settle, with the message's topic) and is sent once more; a
// broker address still missing fails after that one more try; a topic with
// no queue at all, a send whose ctx ended, and any other error are not
// repeated and settle nothing.
func TestSendSyncWaitsOutTheRouteRace(t *testing.T) {
	ctx := context.Background()
	var settled []string
	var callsAtSettle []int
	producer := func(p *routeRaceProducer) plainProducer {
		return plainProducer{Producer: p, settle: func(topic string) bool {
			settled = append(settled, topic)
			callsAtSettle = append(callsAtSettle, p.calls)
			return true
		}}
	}

	race := &routeRaceProducer{noRoute: 1}
	res, err := producer(race).SendSync(ctx, NewMessage("t", []byte("x")))
	require.NoError(t, err)
	require.Equal(t, SendOK, res.Status)
	require.Equal(t, 2, race.calls)
	require.Equal(t, []string{"t"}, settled, "the route is settled once, for the message's topic")
	require.Equal(t, []int{1}, callsAtSettle, "settled between the first send and the second")

	settled = nil
	missing := &routeRaceProducer{noRoute: 5}
	_, err = producer(missing).SendSync(ctx, NewMessage("t", []byte("x")))
	require.ErrorContains(t, err, "route info not found")
	require.Equal(t, 2, missing.calls)
	require.Len(t, settled, 1)

	// No queue found at all: the client asked the name server itself, so
	// nothing is settled or sent again.
	settled = nil
	unknown := &routeRaceProducer{noRoute: 5, err: errors.New("the topic=t route info not found")}
	_, err = producer(unknown).SendSync(ctx, NewMessage("t", []byte("x")))
	require.ErrorContains(t, err, "route info not found")
	require.Equal(t, 1, unknown.calls, "a topic with no queue is not sent again")
	require.Empty(t, settled)

	settled = nil
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	gone := &routeRaceProducer{noRoute: 5}
	_, err = producer(gone).SendSync(cancelled, NewMessage("t", []byte("x")))
	require.Error(t, err)
	require.Equal(t, 1, gone.calls, "no second try once ctx ended")
	require.Empty(t, settled)

	other := &routeRaceProducer{noRoute: 5, err: errors.New("connection refused")}
	_, err = producer(other).SendSync(ctx, NewMessage("t", []byte("x")))
	require.ErrorContains(t, err, "connection refused")
	require.Equal(t, 1, other.calls, "only the route race is sent again")
	require.Empty(t, settled)
}

// settleRoute reaches the name-server side of the client behind both kinds
// of producer on the pinned client's layout (it fails when an upgrade
// changes that layout, and the route race would then only be sent again,
// not waited out). The producers are not started: the route query fails
// against a name server that is not there, which settleRoute ignores.
func TestSettleRouteFindsTheClient(t *testing.T) {
	p, err := NewProducer(ProducerConfig{NameServers: []string{"127.0.0.1:1"}, Group: "settle_plain", InstanceName: "settle_plain"})
	require.NoError(t, err)
	require.NotNil(t, clientOf(p.(plainProducer).Producer))
	require.True(t, settleRoute(p.(plainProducer).Producer, "t"))

	tp, err := NewTxProducer(TxProducerConfig{NameServers: []string{"127.0.0.1:1"}, Group: "settle_tx", InstanceName: "settle_tx",
		SendTimeout: time.Second, Listener: nopListener{}})
	require.NoError(t, err)
	require.NotNil(t, clientOf(tp.(txProducer).TransactionProducer))
	require.True(t, settleRoute(tp.(txProducer).TransactionProducer, "t"))

	require.False(t, settleRoute(struct{}{}, "t"), "an unknown layout: nothing done")
	require.False(t, settleRoute(&struct{ client int }{}, "t"), "an unknown layout: nothing done")
}

// SendHalf reaches the client's inner producer on the pinned layout; an
// unknown layout sends nothing and says so (rmqtx then takes the client's
// SendMessageInTransaction).
func TestSendHalfFindsTheProducer(t *testing.T) {
	tp, err := NewTxProducer(TxProducerConfig{NameServers: []string{"127.0.0.1:1"}, Group: "half_tx", InstanceName: "half_tx",
		SendTimeout: time.Second, Listener: nopListener{}})
	require.NoError(t, err)
	require.NotNil(t, tp.(txProducer).half, "the pinned client's layout: SendHalf can send")

	s, ok := halfSender(struct{}{})
	require.False(t, ok)
	require.Nil(t, s)
	_, ok = halfSender(&struct{ producer *int }{})
	require.False(t, ok, "a producer field that cannot send")
	unknown := txProducer{group: "half_tx"}
	m := NewMessage("t", []byte("x"))
	_, err = unknown.SendHalf(context.Background(), m)
	require.ErrorIs(t, err, ErrNoHalfSend)
	require.Empty(t, m.GetProperty(PropTransactionPrepared), "nothing set on a message that was not sent")
}

type nopListener struct{}

func (nopListener) ExecuteLocalTransaction(*Message) LocalTransactionState {
	return RollbackMessageState
}
func (nopListener) CheckLocalTransaction(*MessageExt) LocalTransactionState {
	return RollbackMessageState
}
