package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// An empty payload is a valid outbox row (a FuncSink command may need
// none), but a broker refuses a message without a body, answering with an
// internal error (code 1) that reads as transient. RocketMQSink refuses it
// before sending, permanently: the row goes DEAD on its first attempt with
// code empty_payload instead of retrying for an hour, and its batch
// siblings are sent.
func TestEmptyPayloadDeadAtOnce(t *testing.T) {
	eachDB(t, func(t *testing.T, b *bed) {
		topic := testenv.Name(t, "topic")
		testenv.CreateTopic(t, topic, 4)
		evs := events(topic, 3)
		evs = append(evs, Event{EventType: "ThingHappened", Destination: topic, MessageKey: "k-empty"})
		ids := b.enqueue(t, evs...)
		empty := ids[len(ids)-1]
		b.dispatcher(t, Config{Sink: b.sink(t), PollInterval: 50 * time.Millisecond,
			BackoffBase: 5 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
		b.waitStatus(t, StatusSent, 3, 30*time.Second)
		b.waitStatus(t, StatusDead, 1, 30*time.Second)
		row, err := b.table.Get(context.Background(), b.db, empty)
		require.NoError(t, err)
		require.Equal(t, StatusDead, row.Status)
		require.Equal(t, "empty_payload", row.LastErrorCode)
		require.Contains(t, row.LastErrorMessage, "payload is empty")
		require.LessOrEqual(t, row.RetryCount, 1, "dead on its first attempt, not after retries")
	})
}
