package broker

import (
	"context"
	"errors"
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/stretchr/testify/require"
)

// routeRaceProducer fails its first noRoute sends as the client does when a
// concurrent first send to the topic won its route-cache race.
type routeRaceProducer struct {
	rocketmq.Producer
	noRoute, calls int
}

func (p *routeRaceProducer) SendSync(context.Context, ...*Message) (*SendResult, error) {
	p.calls++
	if p.calls <= p.noRoute {
		return nil, errors.New("the topic=t route info not found, it may not exist")
	}
	return &SendResult{Status: SendOK}, nil
}

// A send that met the client's route race is sent once more and succeeds;
// a topic with no route at all fails after that one more try; other errors
// are not repeated.
func TestSendSyncRetriesTheRouteRaceOnce(t *testing.T) {
	ctx := context.Background()
	race := &routeRaceProducer{noRoute: 1}
	res, err := plainProducer{race}.SendSync(ctx, NewMessage("t", []byte("x")))
	require.NoError(t, err)
	require.Equal(t, SendOK, res.Status)
	require.Equal(t, 2, race.calls)

	missing := &routeRaceProducer{noRoute: 5}
	_, err = plainProducer{missing}.SendSync(ctx, NewMessage("t", []byte("x")))
	require.ErrorContains(t, err, "route info not found")
	require.Equal(t, 2, missing.calls)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	gone := &routeRaceProducer{noRoute: 5}
	_, err = plainProducer{gone}.SendSync(cancelled, NewMessage("t", []byte("x")))
	require.Error(t, err)
	require.Equal(t, 1, gone.calls, "no second try once ctx ended")
}
