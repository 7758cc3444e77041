package txproducer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/txproducer"
)

// A Shutdown whose deadline passes while a Send is inside its local
// transaction returns the deadline error at once, yet must not stop the
// client under that Send: the Send still commits, is delivered, and the
// client is stopped afterwards (run with -race to see the client's race).
// On both databases: the Send under Shutdown commits its txlog row there.
func TestShutdownDeadlineWithSendInFlight(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		p, err := txproducer.New(b.config())
		require.NoError(t, err)
		ctx := context.Background()
		require.NoError(t, p.Start(ctx))

		inside, release := make(chan struct{}), make(chan struct{})
		type result struct {
			res txproducer.Result
			err error
		}
		sent := make(chan result, 1)
		go func() {
			res, err := p.Send(ctx, txproducer.Message{Topic: b.topic, EventType: "OrderPlaced", Payload: []byte(`{}`)},
				func(ctx context.Context, tx *sqlx.Tx) error {
					close(inside)
					<-release
					_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, amount) VALUES ('late', 1)")
					return err
				})
			sent <- result{res, err}
		}()
		<-inside

		expired, cancel := context.WithCancel(ctx)
		cancel()
		err = p.Shutdown(expired)
		require.ErrorIs(t, err, context.Canceled)
		_, err = p.Send(ctx, txproducer.Message{Topic: b.topic, EventType: "OrderPlaced", Payload: []byte(`{}`)},
			func(context.Context, *sqlx.Tx) error { return nil })
		require.ErrorIs(t, err, txproducer.ErrClosed, "no new Send after Shutdown")

		close(release)
		r := <-sent
		require.NoError(t, r.err)
		require.Equal(t, txproducer.StateCommitted, r.res.State)
		snap := b.coll.WaitDistinct(t, 1, 60*time.Second)
		require.Equal(t, 1, snap.Counts[r.res.EventID])
		require.NoError(t, p.Shutdown(ctx), "a second Shutdown is a no-op")
	})
}
