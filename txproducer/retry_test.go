package txproducer_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// A business-key id can be retried after an ordinary failure: the first
// Send's local transaction fails (its rollback is persisted, naming its
// half), and its END_TRANSACTION is lost, so the real broker keeps the
// first half and checks it later. The retry with the same id takes the id
// over and commits it. The broker's late checks of the first half are
// answered ROLLBACK from the txlog (the row names the retry's half), never
// COMMIT, never UNKNOWN past the fence age. An independent consumer counts
// one copy after a marker; one business row.
func TestRetrySameIDAfterLocalFailure(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testRetrySameIDAfterLocalFailure)
}

func testRetrySameIDAfterLocalFailure(t *testing.T, b *bundle) {
	id := "retry-" + testenv.RandSuffix(8)
	cfg := b.config()
	var first atomic.Bool
	first.Store(true)
	cfg.Test.LoseEnd = func(eventID string) bool { return eventID == id && first.Load() }
	p := startProducer(t, cfg)
	ctx := context.Background()

	res, err := p.Send(ctx, b.msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
		if err := insertOrder(id)(ctx, tx); err != nil {
			return err
		}
		return errBusiness // e.g. out of stock
	})
	require.ErrorIs(t, err, errBusiness)
	require.Equal(t, txproducer.StateRolledBack, res.State)
	require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err))
	firstRow := b.row(t, id)
	require.Equal(t, txlog.StateRolledBack, firstRow.State)
	require.Equal(t, txlog.ByLocalRollback, firstRow.ResolvedBy)
	firstHalf := firstRow.Half()
	require.NotEmpty(t, firstHalf, "the rollback names its half")
	first.Store(false)

	again, err := p.Send(ctx, b.msg(id), insertOrder(id))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, again.State)
	require.False(t, again.Duplicate, "the retry committed the id itself")
	row := b.row(t, id)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.NotEqual(t, firstHalf, row.Half(), "the row names the retry's half")

	// The broker checks the first half (its END was lost): ROLLBACK.
	as := b.rec.waitT(t, id, "a late check of the first half answered", hasDecision(checkback.Rollback))
	for _, a := range as {
		require.NotEqual(t, checkback.Commit, a.Decision, "%+v", a)
	}
	noUnknownPastFenceAge(t, as)

	// A third Send of the committed id is a Duplicate, and nothing runs.
	dup, err := p.Send(ctx, b.msg(id), func(context.Context, *sqlx.Tx) error {
		t.Error("the function ran for a committed id")
		return nil
	})
	require.NoError(t, err)
	require.True(t, dup.Duplicate)
	b.exactlyOneCopy(t, p, id)
}

// A rollback recorded by an rmqtx that did not name halves stays final: a
// Send of that id is fenced and told to use a new id; the new id commits.
func TestRetryAfterLegacyRollback(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		p := startProducer(t, b.config())
		ctx := context.Background()
		id := "legacy-" + testenv.RandSuffix(8)
		_, _, err := b.store.Fence(ctx, txlog.Row{EventID: id, ProducerGroup: b.group, ResolvedBy: txlog.ByLocalRollback})
		require.NoError(t, err)
		require.Empty(t, b.row(t, id).Half(), "a row as an earlier rmqtx wrote it")

		res, err := p.Send(ctx, b.msg(id), insertOrder(id))
		require.ErrorIs(t, err, txproducer.ErrFenced)
		require.Equal(t, txproducer.StateRolledBack, res.State)
		require.Equal(t, txproducer.RetryWithNewID, txproducer.RetryAdvice(err), "%v", err)

		fresh := id + "-2"
		res, err = p.Send(ctx, b.msg(fresh), insertOrder(fresh))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		b.exactlyOneCopy(t, p, fresh)
		b.sendMarker(t, p)
		require.Zero(t, b.coll.Snapshot().Counts[id])
	})
}
