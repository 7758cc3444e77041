package discard_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/txlog"
)

// scrubPanicPublisher is fakePublisher whose SendSync panics once with
// value(msgs): a message, its body, its properties, or an error whose text
// renders the message.
type scrubPanicPublisher struct {
	*fakePublisher
	value func(msgs []*primitive.Message) any
	done  bool
}

func (p *scrubPanicPublisher) SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	if !p.done {
		p.done = true
		panic(p.value(msgs))
	}
	return p.fakePublisher.SendSync(ctx, msgs...)
}

// TestRecoveryPanicValueScrubbed: a panic while recovering whose value
// holds the event's payload (the message, its body or properties, or an
// error that formats the message) reaches neither the returned error nor
// the log: the value goes through the log scrubber (rmqlog.ScrubValue)
// before it is formatted. The event is republished on the next attempt.
func TestRecoveryPanicValueScrubbed(t *testing.T) {
	t.Parallel()
	const card, street = "4111111111111111", "Secret Lane 7"
	body := []byte(`{"card":"` + card + `"}`)
	for _, tc := range []struct {
		name  string
		value func(msgs []*primitive.Message) any
	}{
		{"message", func(msgs []*primitive.Message) any { return msgs[0] }},
		{"body", func(msgs []*primitive.Message) any { return msgs[0].Body }},
		{"properties", func(msgs []*primitive.Message) any { return msgs[0].GetProperties() }},
		{"error formatting the message", func(msgs []*primitive.Message) any { return fmt.Errorf("cannot send %v", msgs[0]) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			log := newFakeLog()
			row := committedRow("c", "orders", body)
			log.rows["c"] = row
			pub := &scrubPanicPublisher{fakePublisher: &fakePublisher{}, value: func(msgs []*primitive.Message) any {
				msgs[0].WithProperty("address", street) // a user property the panic value carries
				return tc.value(msgs)
			}}
			l, hook := test.NewNullLogger()
			l.SetLevel(logrus.TraceLevel)
			r := recovery(t, log, pub, func(c *discard.Config) { c.Logger = l })
			ctx := context.Background()

			_, err := r.Handle(ctx, discarded("g", "c", body))
			require.ErrorContains(t, err, "discard: panic while recovering c")
			require.NotContains(t, err.Error(), card)
			require.NotContains(t, err.Error(), street)
			require.NotEmpty(t, hook.AllEntries(), "the failed attempt is logged")
			for _, e := range hook.AllEntries() {
				line, ferr := (&logrus.TextFormatter{DisableColors: true}).Format(e)
				require.NoError(t, ferr)
				require.False(t, bytes.Contains(line, []byte(card)) || bytes.Contains(line, []byte(street)) ||
					bytes.Contains(line, []byte(fmt.Sprint(body))), "a payload reached the log: %s", line)
			}

			res, err := r.Handle(ctx, discarded("g", "c", body))
			require.NoError(t, err)
			require.Equal(t, txlog.RecoveryRepublished, res.Decision)
		})
	}
}
