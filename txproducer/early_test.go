package txproducer_test

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The local transaction begins, and inserts its txlog row, while the half
// message is in flight. When the broker then refuses the half, that
// transaction must be rolled back: no txlog row, no business row, the
// function never runs, and the id is not spent. Here the real broker
// refuses the first Send (a 4 MiB payload plus properties is above its
// maxMessageSize); the second Send of the same id commits, and the topic
// holds exactly one copy.
func TestHalfRefusedRollsBackEarlyTransaction(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testHalfRefusedRollsBackEarlyTransaction)
}

func testHalfRefusedRollsBackEarlyTransaction(t *testing.T, b *bundle) {
	cfg := b.config()
	cfg.MaxPayloadBytes = 4 << 20 // let the broker, not rmqtx, refuse it
	p := startProducer(t, cfg)
	id := "refused-" + testenv.RandSuffix(6)

	big := b.msg(id)
	big.Payload = make([]byte, 4<<20)
	_, err := rand.Read(big.Payload) // incompressible: the client compresses large bodies
	require.NoError(t, err)
	ran := false
	res, err := p.Send(context.Background(), big, func(context.Context, *sqlx.Tx) error { ran = true; return nil })
	require.ErrorIs(t, err, txproducer.ErrSend, "the broker refuses a message above maxMessageSize")
	require.Equal(t, txproducer.StateRolledBack, res.State)
	require.False(t, ran, "the function must not run when the half was not stored")
	_, err = b.store.Get(context.Background(), id)
	require.ErrorIs(t, err, txlog.ErrNotFound, "the early transaction's row must be rolled back")
	require.Zero(t, b.db.Stats().InUse, "the early transaction must give its connection back")

	res, err = p.Send(context.Background(), b.msg(id), insertOrder(id))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.False(t, res.Duplicate)
	row := b.row(t, id)
	require.Equal(t, txlog.StateCommitted, row.State)
	b.exactlyOneCopy(t, p, id)
}
