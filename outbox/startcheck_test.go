package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// outageAfterStart is a RocketMQSink whose name server was reachable at
// Start: for tests of an outage that begins after it.
type outageAfterStart struct{ *RocketMQSink }

func (outageAfterStart) checkReachable(context.Context) error { return nil }

// requireStartRefused checks that a dispatcher on sink does not start, and
// says which name server did not answer.
func requireStartRefused(t *testing.T, b *bed, sink Sink, addr string) {
	t.Helper()
	d, err := NewDispatcher(Config{DB: b.db, Sink: sink})
	require.NoError(t, err)
	err = d.Start(context.Background())
	require.ErrorIs(t, err, ErrNameServerUnreachable)
	require.Contains(t, err.Error(), addr+": connection refused")
}

// TestStartChecksReachability: Dispatcher.Start fails, naming the address
// and the cause, against a closed database port and (with a RocketMQSink)
// a closed name-server port, and starts against the real ones. A FuncSink
// needs no name server.
func TestStartChecksReachability(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *bed) {
		closed := testenv.ClosedAddr(t)
		d, err := NewDispatcher(Config{DB: testenv.PoolVia(t, b.db, closed), Sink: FuncSink(func(context.Context, *Message) error { return nil })})
		require.NoError(t, err)
		began := time.Now()
		err = d.Start(context.Background())
		require.Less(t, time.Since(began), 10*time.Second)
		require.ErrorIs(t, err, ErrDatabaseUnreachable)
		require.Contains(t, err.Error(), closed+": connection refused")
		require.NoError(t, d.Close(), "an unstarted dispatcher closes")

		requireStartRefused(t, b, b.sink(t, closed), closed)

		b.dispatcher(t, Config{Sink: FuncSink(func(context.Context, *Message) error { return nil })})
		b.dispatcher(t, Config{Sink: b.sink(t)})
	})
}

// TestEnqueueRefusesOversizedPayload: Enqueue refuses a payload over the
// limit txproducer's Send applies, with the same error, before anything is
// written; the caller's transaction stays usable and commits its other
// work.
func TestEnqueueRefusesOversizedPayload(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, b *bed) {
		ctx := context.Background()
		require.Equal(t, wire.MaxPayloadBytes, MaxPayloadLen)
		tx, err := b.db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = b.table.Enqueue(ctx, tx, Event{EventType: "Big", Destination: "t", Payload: make([]byte, wire.MaxPayloadBytes+1)})
		require.ErrorIs(t, err, ErrPayloadTooLarge)
		require.ErrorIs(t, err, wire.ErrPayloadTooLarge)
		require.ErrorIs(t, err, ErrInvalidEvent)
		require.True(t, strings.Contains(err.Error(), "limit"), err)
		// The transaction is usable: the limit itself and a small event go in.
		_, err = b.table.Enqueue(ctx, tx, Event{EventType: "AtLimit", Destination: "t", Payload: make([]byte, wire.MaxPayloadBytes)})
		require.NoError(t, err)
		id, err := b.table.Enqueue(ctx, tx, Event{EventType: "Small", Destination: "t", Payload: []byte("x")})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		var types []string
		require.NoError(t, sqlx.SelectContext(ctx, b.db, &types, "SELECT event_type FROM "+b.table.Name()+" ORDER BY event_type"))
		require.Equal(t, []string{"AtLimit", "Small"}, types)
		row, err := b.table.Get(ctx, b.db, id)
		require.NoError(t, err)
		require.Equal(t, StatusPending, row.Status)
	})
}
