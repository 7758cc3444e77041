package txlog_test

import (
	"context"
	"errors"
	"io/fs"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
)

func TestNewValidatesPrefix(t *testing.T) {
	t.Parallel()
	_, err := txlog.New(nil, txlog.DefaultPrefix)
	require.ErrorIs(t, err, txlog.ErrInvalid)
	for _, bad := range []string{"1x", "a-b", "a;drop", "a b", "abcdefghijklmnopqrstuvwxyz"} {
		_, err := txlog.New(nilDB(), bad)
		require.ErrorIs(t, err, txlog.ErrInvalid, bad)
	}
	s, err := txlog.New(nilDB(), "svc_")
	require.NoError(t, err)
	require.Equal(t, "svc_txlog", s.Table())

	// "" means DefaultPrefix, as in every rmqtx package.
	s, err = txlog.New(nilDB(), "")
	require.NoError(t, err)
	require.Equal(t, txlog.DefaultPrefix+"txlog", s.Table())
	name, err := txlog.TableName("")
	require.NoError(t, err)
	require.Equal(t, s.Table(), name)
	_, names, err := txlog.Migrations("mysql", "")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"{{table}}": s.Table()}, names)
}

func TestMigrationsEmbedded(t *testing.T) {
	t.Parallel()
	fsys, names, err := txlog.Migrations("mysql", "svc_")
	require.NoError(t, err)
	b, err := fs.ReadFile(fsys, "001_create_txlog.sql")
	require.NoError(t, err)
	require.Contains(t, string(b), "CREATE TABLE IF NOT EXISTS {{table}}")
	require.Equal(t, map[string]string{"{{table}}": "svc_txlog"}, names)
	pg, _, err := txlog.Migrations("postgres", "svc_")
	require.NoError(t, err)
	b, err = fs.ReadFile(pg, "001_create_txlog.sql")
	require.NoError(t, err)
	require.Contains(t, string(b), "CREATE TABLE IF NOT EXISTS {{table}}")
	_, _, err = txlog.Migrations("oracle", "svc_")
	require.ErrorIs(t, err, txlog.ErrInvalid, "a dialect with no migrations is refused")
}

// setup is a store on a fresh MariaDB database, for the tests of
// go-sql-driver DSN settings; setupOn takes the database (testenv.EachDB).
func setup(t *testing.T) *txlog.Store {
	t.Helper()
	return setupOn(t, testenv.MySQLDB(t))
}

func setupOn(t *testing.T, db *sqlx.DB) *txlog.Store {
	t.Helper()
	s, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
	return s
}

func committed(id string) txlog.Row {
	return txlog.Row{EventID: id, ProducerGroup: "g", Topic: "t", EventType: "e", State: txlog.StateCommitted,
		Payload: []byte("p"), PayloadHash: "h", ResolvedBy: txlog.ByLocalCommit}
}

func TestInsertVisibleOnlyAtCommit(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testInsertVisibleOnlyAtCommit)
}

func testInsertVisibleOnlyAtCommit(t *testing.T, db *sqlx.DB) {
	s := setupOn(t, db)
	ctx := context.Background()
	tx, err := s.DB().BeginTxx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, s.Insert(ctx, tx, committed("a1")))
	_, err = s.Get(ctx, "a1")
	require.ErrorIs(t, err, txlog.ErrNotFound, "uncommitted row must be invisible")
	require.NoError(t, tx.Commit())
	r, err := s.Get(ctx, "a1")
	require.NoError(t, err)
	require.Equal(t, txlog.StateCommitted, r.State)
	require.Equal(t, []byte("p"), r.Payload)
	require.Equal(t, txlog.ByLocalCommit, r.ResolvedBy)
	require.False(t, r.CreatedAt.IsZero())

	// A second insert of the same id is a typed duplicate.
	tx, err = s.DB().BeginTxx(ctx, nil)
	require.NoError(t, err)
	err = s.Insert(ctx, tx, committed("a1"))
	require.ErrorIs(t, err, txlog.ErrDuplicate)
	require.NoError(t, tx.Rollback())
}

// The fence waits on the row lock of a local transaction in flight and
// returns the local outcome.
func TestFenceWaitsForInFlightTransaction(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testFenceWaitsForInFlightTransaction)
}

func testFenceWaitsForInFlightTransaction(t *testing.T, db *sqlx.DB) {
	s := setupOn(t, db)
	for _, commit := range []bool{true, false} {
		ctx := context.Background()
		id := "f-" + testenv.RandSuffix(8)
		tx, err := s.DB().BeginTxx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, s.Insert(ctx, tx, committed(id)))

		type res struct {
			row    txlog.Row
			fenced bool
			err    error
		}
		done := make(chan res, 1)
		go func() {
			r, f, err := s.Fence(ctx, txlog.Row{EventID: id, ProducerGroup: "g"})
			done <- res{r, f, err}
		}()
		// Wait until the fence's INSERT is really blocked on the lock.
		testenv.Eventually(t, 10*time.Second, "fence blocked on the row lock", func() bool {
			return blockedInserts(s.DB()) > 0
		})
		select {
		case r := <-done:
			t.Fatalf("fence returned while the local tx holds the lock: %+v", r)
		default:
		}
		if commit {
			require.NoError(t, tx.Commit())
		} else {
			require.NoError(t, tx.Rollback())
		}
		r := <-done
		require.NoError(t, r.err)
		if commit {
			require.False(t, r.fenced)
			require.Equal(t, txlog.StateCommitted, r.row.State)
		} else {
			require.True(t, r.fenced)
			require.Equal(t, txlog.StateRolledBack, r.row.State)
			require.Equal(t, txlog.ByFence, r.row.ResolvedBy)
		}
	}
}

// A local transaction that starts after the fence fails on the duplicate key.
func TestLocalTransactionLosesToFence(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testLocalTransactionLosesToFence)
}

func testLocalTransactionLosesToFence(t *testing.T, db *sqlx.DB) {
	s := setupOn(t, db)
	ctx := context.Background()
	row, fenced, err := s.Fence(ctx, txlog.Row{EventID: "late", ProducerGroup: "g"})
	require.NoError(t, err)
	require.True(t, fenced)
	require.Equal(t, txlog.StateRolledBack, row.State)
	tx, err := s.DB().BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	err = s.Insert(ctx, tx, committed("late"))
	require.ErrorIs(t, err, txlog.ErrDuplicate)
	// Fencing again is a no-op that returns the same decision.
	row2, fenced, err := s.Fence(ctx, txlog.Row{EventID: "late"})
	require.NoError(t, err)
	require.False(t, fenced)
	require.Equal(t, row.ResolvedAt, row2.ResolvedAt)
}

// The store's statements, then the same again through a pool that sends
// them as text with the values in them: go-sql-driver's interpolateParams,
// pgx's simple protocol (what a transaction-pooling PgBouncer needs; on pgx
// rmqtx's statements follow the pool's exec mode).
func TestListCountMarkAndDelete(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		testListCountMarkAndDelete(t, db)
		var text *sqlx.DB
		if db.DriverName() == "mysql" {
			text = testenv.MySQLVariant(t, db, func(c *mysql.Config) { c.InterpolateParams = true })
		} else {
			text = testenv.PGVariant(t, db, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol })
		}
		s := setupOn(t, db)
		_, err := db.Exec("DELETE FROM " + s.Table())
		require.NoError(t, err)
		testListCountMarkAndDelete(t, text)
	})
}

func testListCountMarkAndDelete(t *testing.T, db *sqlx.DB) {
	s := setupOn(t, db)
	ctx := context.Background()
	old := time.Now().UTC().Add(-48 * time.Hour)
	for i := 0; i < 7; i++ {
		r := committed("old-" + string(rune('a'+i)))
		r.CreatedAt, r.ResolvedAt = old, old
		_, ins, err := s.Record(ctx, r)
		require.NoError(t, err)
		require.True(t, ins)
	}
	_, _, err := s.Fence(ctx, txlog.Row{EventID: "old-fenced", ProducerGroup: "g", CreatedAt: old, ResolvedAt: old})
	require.NoError(t, err)
	_, _, err = s.Record(ctx, committed("fresh"))
	require.NoError(t, err)

	require.NoError(t, s.MarkRecovered(ctx, "old-a", txlog.RecoveryRepublished, "test"))
	require.ErrorIs(t, s.MarkRecovered(ctx, "nope", txlog.RecoveryDropped, ""), txlog.ErrNotFound)

	n, err := s.Count(ctx, txlog.Filter{CreatedBefore: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 8, n)
	n, err = s.Count(ctx, txlog.Filter{ResolvedBy: txlog.ByFence})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	yes := true
	rs, err := s.List(ctx, txlog.Filter{Recovered: &yes})
	require.NoError(t, err)
	require.Len(t, rs, 1)
	require.Equal(t, txlog.RecoveryRepublished, rs[0].RecoveryDecision)
	require.Nil(t, rs[0].Payload, "payload is not listed unless asked")

	// Keyset pagination visits every row once.
	seen := map[string]bool{}
	f := txlog.Filter{Limit: 3}
	for {
		page, err := s.List(ctx, f)
		require.NoError(t, err)
		if len(page) == 0 {
			break
		}
		for _, r := range page {
			require.False(t, seen[r.EventID])
			seen[r.EventID] = true
		}
		f.After = &page[len(page)-1]
	}
	require.Len(t, seen, 9)

	_, err = s.DeleteTerminalBefore(ctx, time.Now().Add(-time.Hour), 2)
	require.ErrorIs(t, err, txlog.ErrRetentionTooShort)
	deleted, err := s.DeleteTerminalBefore(ctx, time.Now().Add(-25*time.Hour), 2)
	require.NoError(t, err)
	require.EqualValues(t, 8, deleted)
	_, err = s.Get(ctx, "fresh")
	require.NoError(t, err, "rows inside the retention window stay")
}

func TestInsertRejectsInvalidRows(t *testing.T) {
	t.Parallel()
	s, err := txlog.New(nilDB(), "")
	require.NoError(t, err)
	err = s.Insert(context.Background(), nil, txlog.Row{EventID: "x", State: "PENDING", ResolvedBy: txlog.ByFence})
	require.True(t, errors.Is(err, txlog.ErrInvalid))
	err = s.Insert(context.Background(), nil, txlog.Row{State: txlog.StateCommitted, ResolvedBy: txlog.ByFence})
	require.True(t, errors.Is(err, txlog.ErrInvalid))
}
