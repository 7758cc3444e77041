package discard_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// Recovery reads committed data only, whatever isolation level its pool's
// sessions default to, on each database: a local transaction that has
// inserted its COMMITTED txlog row but not committed is never republished
// while it runs (MariaDB's READ UNCOMMITTED sessions can read that row).
// While it is in flight recovery cannot decide (the fence waits on its row
// lock) and asks to be retried. Once it has failed, the discarded half is
// dropped; once it has committed, also while a recovery's fence waited on
// its row, the event is republished (the fence meets the committed row at
// every level; PostgreSQL's REPEATABLE READ and SERIALIZABLE would fail it
// with a serialization failure and leave the half undecided).
func TestRecoveryReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
		for _, level := range testenv.IsolationLevels {
			for _, end := range []string{"rollback", "commit"} {
				t.Run(level+"/"+end, func(t *testing.T) { testRecoveryReadsCommittedOnly(t, db, level, end == "commit") })
			}
		}
	})
}

func testRecoveryReadsCommittedOnly(t *testing.T, db *sqlx.DB, level string, commits bool) {
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ctx := context.Background()
	pool, err := txlog.New(testenv.SessionIsolationDB(t, db, level), txlog.DefaultPrefix)
	require.NoError(t, err)
	pub := &fakePublisher{}

	id := wire.NewEventID()
	body := []byte(`{"ghost":true}`)
	row := committedRow(id, "orders", body)
	row.ProducerGroup = "g"
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	require.NoError(t, store.Insert(ctx, tx, row)) // in flight: inserted first, not committed
	var dirty int
	require.NoError(t, pool.DB().Get(&dirty, pool.DB().Rebind("SELECT COUNT(*) FROM "+pool.Table()+" WHERE event_id = ?"), id))
	if db.DriverName() == "mysql" && level == testenv.ReadUncommitted {
		require.Equal(t, 1, dirty, "precondition: the session reads uncommitted rows")
	} else {
		require.Zero(t, dirty, "no dirty reads at %s", level)
	}

	if !commits {
		rec := recovery(t, pool, pub, func(cfg *discard.Config) { cfg.QueryTimeout = 500 * time.Millisecond })
		_, err = rec.Handle(ctx, discarded("g", id, body))
		require.Error(t, err, "recovery waits for the decision (retried later)")
		require.Zero(t, pub.count(), "never republished while in flight")

		require.NoError(t, tx.Rollback()) // the local transaction fails
		// The fence of the timed-out attempt may still complete on the
		// server once the lock is released: the row then exists (dropped)
		// or is written now (fenced); either way nothing is published.
		res, err := rec.Handle(ctx, discarded("g", id, body))
		require.NoError(t, err)
		require.Contains(t, []txlog.RecoveryDecision{txlog.RecoveryDropped, txlog.RecoveryFenced}, res.Decision)
		require.Zero(t, pub.count())
		got, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, txlog.StateRolledBack, got.State)
		return
	}

	// A recovery whose fence waits on the row while the local transaction
	// commits republishes the event. (No attempt timed out before it: the
	// statement of a timed-out fence may wait on for a while on the server,
	// and the wait below must see this one's.)
	rec := recovery(t, pool, pub, func(cfg *discard.Config) { cfg.QueryTimeout = 30 * time.Second })
	type handled struct {
		res discard.Result
		err error
	}
	waiting := make(chan handled, 1)
	go func() {
		res, err := rec.Handle(ctx, discarded("g", id, body))
		waiting <- handled{res, err}
	}()
	prefix := "INSERT IGNORE INTO " + pool.Table()
	if db.DriverName() != "mysql" {
		prefix = "INSERT INTO " + pool.Table()
	}
	testenv.Eventually(t, 20*time.Second, "the fence waits on the row lock", func() bool {
		n, err := testenv.LockWaiters(db, prefix)
		require.NoError(t, err)
		return n > 0
	})
	require.Zero(t, pub.count(), "never republished while in flight")
	require.NoError(t, tx.Commit())
	h := <-waiting
	require.NoError(t, h.err, "the fence met the committed row")
	require.Equal(t, txlog.RecoveryRepublished, h.res.Decision)
	require.Equal(t, 1, pub.count())
	got, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, txlog.StateCommitted, got.State)
	require.Equal(t, txlog.ByLocalCommit, got.ResolvedBy, "the local commit decided, not the fence")
	require.Equal(t, txlog.RecoveryRepublished, got.RecoveryDecision)
}
