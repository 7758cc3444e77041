package dialect_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// InsertNew reports a duplicate key without ending the caller's
// transaction, on both databases: the transaction goes on and commits its
// other rows. A plain INSERT's duplicate-key error would abort a PostgreSQL
// transaction (shown first, as the reason for the method); bad data is
// refused as by a plain INSERT.
func TestInsertNewLeavesTheTransactionUsable(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		d, ctx := setup(t, db)
		insert := d.Rebind(d.InsertNew("kv", "k, g, n, at", "?, '', ?, "+d.Now(), "k, g"))
		inserted, err := d.ExecInsertNew(ctx, db, insert, "a", 1)
		require.NoError(t, err)
		require.True(t, inserted)

		if d.Name() == "postgres" {
			tx, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, d.Rebind("INSERT INTO kv (k, g, n, at) VALUES (?, '', 2, "+d.Now()+")"), "a")
			require.True(t, d.IsDuplicateKey(err), "%v", err)
			_, err = tx.ExecContext(ctx, d.Rebind("INSERT INTO kv (k, g, n, at) VALUES (?, '', 2, "+d.Now()+")"), "b")
			require.Error(t, err, "PostgreSQL aborted the transaction at the failed INSERT")
			require.NoError(t, tx.Rollback())
		}

		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		inserted, err = d.ExecInsertNew(ctx, tx, insert, "a", 2)
		require.NoError(t, err, "a duplicate is no error")
		require.False(t, inserted)
		inserted, err = d.ExecInsertNew(ctx, tx, insert, "b", 3)
		require.NoError(t, err, "the transaction goes on")
		require.True(t, inserted)
		require.NoError(t, tx.Commit())
		var rows []struct {
			K string `db:"k"`
			N int    `db:"n"`
		}
		require.NoError(t, db.SelectContext(ctx, &rows, "SELECT k, n FROM kv ORDER BY k"))
		require.Equal(t, []struct {
			K string `db:"k"`
			N int    `db:"n"`
		}{{"a", 1}, {"b", 3}}, rows, "the duplicate changed nothing")

		_, err = d.ExecInsertNew(ctx, db, insert, "a-key-far-longer-than-the-column-allows", 4)
		require.Error(t, err, "bad data is refused, not truncated")
		require.False(t, d.IsDuplicateKey(err))
	})
}

// LatestCommitted runs a write that waits on another transaction's row so
// that it meets the row that transaction committed, whatever the session's
// default isolation level: here an insert that skips an existing key, on a
// pool whose sessions default to each level, while another transaction
// holds the key and then commits. Run bare on PostgreSQL at REPEATABLE READ
// or SERIALIZABLE, the same insert fails with a serialization failure.
func TestLatestCommittedMeetsTheCommittedRow(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		d, ctx := setup(t, db)
		ignore := d.Rebind(d.InsertIgnore("kv", "k, g, n, at", "?, '', ?, "+d.Now(), "k, g"))
		for _, level := range testenv.IsolationLevels {
			pool := testenv.SessionIsolationDB(t, db, level)
			for _, bare := range []bool{false, true} {
				key := level + map[bool]string{false: " wrapped", true: " bare"}[bare]
				holder, err := db.BeginTxx(ctx, nil)
				require.NoError(t, err)
				_, err = holder.ExecContext(ctx, ignore, key, 1)
				require.NoError(t, err)

				done := make(chan error, 1)
				var inserted int64 = -1
				write := func(ctx context.Context, e sqlx.ExtContext) error {
					res, err := e.ExecContext(ctx, ignore, key, 2)
					if err == nil {
						inserted, err = res.RowsAffected()
					}
					return err
				}
				go func() {
					if bare {
						done <- write(ctx, pool)
						return
					}
					done <- d.LatestCommitted(ctx, pool, write)
				}()
				prefix := "INSERT IGNORE INTO kv"
				if d.Name() == "postgres" {
					prefix = "INSERT INTO kv"
				}
				testenv.Eventually(t, 30*time.Second, key+": the insert waits on the row", func() bool {
					n, err := testenv.LockWaiters(db, prefix)
					require.NoError(t, err)
					return n > 0
				})
				require.NoError(t, holder.Commit())
				err = <-done
				snapshotFails := d.Name() == "postgres" && (level == testenv.RepeatableRead || level == testenv.Serializable)
				if bare && snapshotFails {
					require.True(t, dialect.RolledBack(err), "%s: a serialization failure, got %v", key, err)
					continue
				}
				require.NoError(t, err, key)
				require.Zero(t, inserted, "%s: the committed row was met, nothing inserted", key)
			}
		}
	})
}
