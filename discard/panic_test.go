package discard_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/txlog"
)

// panickyLog is fakeLog whose Get panics while panics is positive.
type panickyLog struct {
	*fakeLog
	panics atomic.Int64
}

func (l *panickyLog) Get(ctx context.Context, id string) (txlog.Row, error) {
	if l.panics.Add(-1) >= 0 {
		panic("log bug in Get")
	}
	return l.fakeLog.Get(ctx, id)
}

// panickyPublisher is fakePublisher whose SendSync panics while panics is
// positive.
type panickyPublisher struct {
	*fakePublisher
	panics atomic.Int64
}

func (p *panickyPublisher) SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	if p.panics.Add(-1) >= 0 {
		panic("publisher bug in SendSync")
	}
	return p.fakePublisher.SendSync(ctx, msgs...)
}

// TestRecoveryHandlePanic: a panic in the Log or the Publisher while Handle
// decides a message is returned as an error naming it (the subscription
// then redelivers the message), the decision is not recorded, and a later
// Handle of the same message decides normally: the committed event is
// republished once.
func TestRecoveryHandlePanic(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	for _, tc := range []struct {
		name, panicText string
		log             bool // the Log panics; else the Publisher
	}{
		{"log", "log bug in Get", true},
		{"publisher", "publisher bug in SendSync", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log := &panickyLog{fakeLog: newFakeLog()}
			log.rows["c"] = committedRow("c", "orders", body)
			pub := &panickyPublisher{fakePublisher: &fakePublisher{}}
			if tc.log {
				log.panics.Store(1)
			} else {
				pub.panics.Store(1)
			}
			var results []discard.Result
			r := recovery(t, log, pub, func(c *discard.Config) {
				c.OnDecision = func(res discard.Result) { results = append(results, res) }
			})
			ctx := context.Background()

			res, err := r.Handle(ctx, discarded("g", "c", body))
			require.Error(t, err)
			require.ErrorContains(t, err, "discard: panic while recovering c")
			require.ErrorContains(t, err, tc.panicText)
			require.Equal(t, err, res.Err)
			require.Empty(t, log.recovered, "no decision recorded")
			require.True(t, log.row("c").RecoveredAt.IsZero())
			require.Zero(t, pub.count(), "nothing published")
			require.Len(t, results, 1, "the failed attempt is reported")
			require.Error(t, results[0].Err)

			res, err = r.Handle(ctx, discarded("g", "c", body))
			require.NoError(t, err)
			require.Equal(t, txlog.RecoveryRepublished, res.Decision)
			require.Equal(t, 1, pub.count())
			require.Equal(t, map[string]txlog.RecoveryDecision{"c": txlog.RecoveryRepublished}, log.recovered)
			require.Equal(t, txlog.StateCommitted, log.row("c").State, "the row itself is unchanged")
		})
	}
}
