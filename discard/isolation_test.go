package discard_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// Recovery reads committed data only, even through a pool whose sessions
// default to READ UNCOMMITTED: a local transaction that has inserted its
// COMMITTED txlog row but not committed (and then fails) is never
// republished. While it is in flight recovery cannot decide (the fence
// waits on its row lock) and asks to be retried; once it has failed, the
// discarded half is dropped.
func TestRecoveryReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
	ru, err := txlog.New(testenv.ReadUncommittedDB(t, db), txlog.DefaultPrefix)
	require.NoError(t, err)
	pub := &fakePublisher{}
	rec := recovery(t, ru, pub, func(cfg *discard.Config) { cfg.QueryTimeout = 500 * time.Millisecond })

	id := wire.NewEventID()
	body := []byte(`{"ghost":true}`)
	row := committedRow(id, "orders", body)
	row.ProducerGroup = "g"
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Insert(ctx, tx, row)) // in flight: inserted first, not committed
	var dirty int
	require.NoError(t, ru.DB().Get(&dirty, "SELECT COUNT(*) FROM "+ru.Table()+" WHERE event_id = ?", id))
	require.Equal(t, 1, dirty, "precondition: the session reads uncommitted rows")

	_, err = rec.Handle(ctx, discarded("g", id, body))
	require.Error(t, err, "recovery waits for the decision (retried later)")
	require.Zero(t, pub.count(), "never republished while in flight")

	require.NoError(t, tx.Rollback()) // the local transaction fails
	// The fence of the timed-out attempt may still complete on the server
	// once the lock is released: the row then exists (dropped) or is
	// written now (fenced); either way nothing is published.
	res, err := rec.Handle(ctx, discarded("g", id, body))
	require.NoError(t, err)
	require.Contains(t, []txlog.RecoveryDecision{txlog.RecoveryDropped, txlog.RecoveryFenced}, res.Decision)
	require.Zero(t, pub.count())
	got, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, txlog.StateRolledBack, got.State)
}
