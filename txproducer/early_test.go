package txproducer_test

import (
	"context"
	"crypto/rand"
	"runtime"
	"strings"
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

// The early transaction runs on one of the producer's long-lived workers
// (internal/workerpool), not on a new goroutine per Send: a new goroutine's
// stack grew through BEGIN and the INSERT on every Send (BENCHMARKS.md). One
// Send after another finds the worker idle, so all of them run on the same
// goroutine, and every Send still commits exactly one copy.
func TestEarlyTransactionRunsOnALongLivedWorker(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testEarlyTransactionRunsOnALongLivedWorker)
}

func testEarlyTransactionRunsOnALongLivedWorker(t *testing.T, b *bundle) {
	cfg := b.config()
	var stacks []string
	cfg.Test.BeforeLocalTx = func(context.Context, string) {
		buf := make([]byte, 16<<10)
		stacks = append(stacks, string(buf[:runtime.Stack(buf, false)])) // Sends run one at a time here
	}
	p := startProducer(t, cfg)
	ids := make([]string, 3)
	for i := range ids {
		ids[i] = "worker-" + testenv.RandSuffix(6)
		res, err := p.Send(context.Background(), b.msg(ids[i]), insertOrder(ids[i]))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
	}
	require.Len(t, stacks, len(ids))
	for i, s := range stacks {
		require.Contains(t, s, "workerpool.(*Pool).work", "Send %d's early transaction ran on a worker", i+1)
		require.Equal(t, goroutineID(stacks[0]), goroutineID(s), "Send %d found the worker idle and ran on it", i+1)
	}
	for _, id := range ids {
		require.Equal(t, txlog.StateCommitted, b.row(t, id).State)
		b.exactlyOneCopy(t, p, id)
	}
}

// goroutineID is the id in a stack dump's first line ("goroutine 7 [running]:").
func goroutineID(stack string) string {
	if f := strings.Fields(stack); len(f) > 1 {
		return f[1]
	}
	return ""
}
