package txlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
)

// Get reads committed data only even when the session defaults to READ
// UNCOMMITTED: a local transaction's COMMITTED row is invisible until it
// commits, and never visible if it rolls back (no ghost for the check-back
// and recovery, which decide from Get).
func TestGetIgnoresReadUncommittedSession(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testGetIgnoresReadUncommittedSession)
}

func testGetIgnoresReadUncommittedSession(t *testing.T, db *sqlx.DB) {
	s := setupOn(t, db)
	ru, err := txlog.New(testenv.ReadUncommittedDB(t, s.DB()), txlog.DefaultPrefix)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, end := range []string{"rollback", "commit"} {
		id := "ru-" + end
		tx, err := s.DB().BeginTxx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, s.Insert(ctx, tx, committed(id)))
		// MariaDB's session really reads uncommitted data: a plain SELECT
		// sees the row. PostgreSQL runs READ UNCOMMITTED as READ COMMITTED.
		var dirty int
		require.NoError(t, ru.DB().GetContext(ctx, &dirty, ru.DB().Rebind("SELECT COUNT(*) FROM "+ru.Table()+" WHERE event_id = ?"), id))
		if db.DriverName() == "mysql" {
			require.Equal(t, 1, dirty, "precondition: the session reads uncommitted rows")
		} else {
			require.Equal(t, 0, dirty, "PostgreSQL never reads uncommitted rows")
		}

		_, err = ru.Get(ctx, id)
		require.ErrorIs(t, err, txlog.ErrNotFound, "%s: an uncommitted row must be invisible to Get", end)
		if end == "rollback" {
			require.NoError(t, tx.Rollback())
			_, err = ru.Get(ctx, id)
			require.ErrorIs(t, err, txlog.ErrNotFound)
			continue
		}
		require.NoError(t, tx.Commit())
		r, err := ru.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, txlog.StateCommitted, r.State)
	}
}
