package stmtcache_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/sqlcount"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// single opens a one-connection handle on db's database with the default
// DSN (no interpolateParams), so session counters see every statement.
func single(t *testing.T, db *sqlx.DB, mod func(*mysql.Config)) *sqlx.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.Load().DSN(testenv.DBName(t, db)))
	require.NoError(t, err)
	if mod != nil {
		mod(cfg)
	}
	one, err := sqlcount.Single(cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = one.Close() })
	return one
}

// Ten executions of one statement, outside and inside transactions, cost
// one PREPARE and ten round trips; unprepared they cost ten PREPAREs more.
func TestPreparedOncePerConnection(t *testing.T) {
	db := testenv.DB(t)
	ctx := context.Background()
	_, err := db.ExecContext(ctx, "CREATE TABLE kv (k VARCHAR(64) PRIMARY KEY, v INT NOT NULL)")
	require.NoError(t, err)
	for _, interpolate := range []bool{false, true} {
		one := single(t, db, func(c *mysql.Config) { c.InterpolateParams = interpolate })
		m, err := sqlcount.NewMeter(ctx, one)
		require.NoError(t, err)
		c := stmtcache.New(one)
		defer c.Close()
		const upsert = "INSERT INTO kv (k, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = v + VALUES(v)"
		round := func(n int) error {
			for i := 0; i < n; i++ {
				if _, err := c.Exec(ctx, upsert, "a", 1); err != nil {
					return err
				}
				tx, err := one.BeginTxx(ctx, nil)
				if err != nil {
					return err
				}
				if _, err := c.ExecOn(ctx, tx, upsert, "b", 1); err != nil {
					return err
				}
				var v int
				if err := c.TxGet(ctx, tx, &v, "SELECT v FROM kv WHERE k = ?", "b"); err != nil {
					return err
				}
				if err := tx.Commit(); err != nil {
					return err
				}
			}
			return nil
		}
		// The first use inside a transaction runs unprepared and prepares in
		// the background (the only connection is the transaction's).
		first, err := m.Measure(ctx, func() error { return round(1) })
		require.NoError(t, err)
		t.Logf("interpolateParams=%v first: %s", interpolate, first)
		testenv.Eventually(t, 10*time.Second, "statements prepared", func() bool { return c.Len() == 2 })

		got, err := m.Measure(ctx, func() error { return round(10) })
		require.NoError(t, err)
		t.Logf("interpolateParams=%v prepared: %s", interpolate, got)
		require.EqualValues(t, 0, got.Prepare, "every statement was prepared before, on this connection")
		require.EqualValues(t, 30, got.Execute)
		require.EqualValues(t, 0, got.Close)
		// 30 executes + 10 BEGIN + 10 COMMIT
		require.EqualValues(t, 50, got.RoundTrips())

		plain, err := m.Measure(ctx, func() error {
			for i := 0; i < 10; i++ {
				if _, err := one.ExecContext(ctx, upsert, "a", 1); err != nil {
					return err
				}
			}
			return nil
		})
		require.NoError(t, err)
		t.Logf("interpolateParams=%v unprepared: %s", interpolate, plain)
		if !interpolate {
			require.EqualValues(t, 10, plain.Prepare, "the default DSN prepares every statement with arguments")
			require.EqualValues(t, 20, plain.RoundTrips())
		} else {
			require.EqualValues(t, 0, plain.Prepare)
			require.EqualValues(t, 10, plain.RoundTrips())
		}
		var v int
		require.NoError(t, one.GetContext(ctx, &v, "SELECT v FROM kv WHERE k = 'a'"))
		require.Equal(t, 21, v)
		_, err = one.ExecContext(ctx, "DELETE FROM kv")
		require.NoError(t, err)
	}
}

// A transaction of another *sql.DB runs the statement unprepared, with the
// same result; a statement's own error comes back as is. On both
// databases: the cache serves rmqtx's statements on each.
func TestOtherDatabaseAndErrors(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		testOtherDatabaseAndErrors(t, db)
	})
}

// isDBError reports whether err is the server's error for a duplicate key
// (dup) or a missing table (!dup), as MariaDB or PostgreSQL numbers it.
func isDBError(err error, dup bool) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return (dup && me.Number == 1062) || (!dup && me.Number == 1146)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return (dup && pe.Code == "23505") || (!dup && pe.Code == "42P01")
	}
	return false
}

func testOtherDatabaseAndErrors(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	q := db.Rebind
	_, err := db.ExecContext(ctx, "CREATE TABLE kv (k VARCHAR(64) PRIMARY KEY, v INT NOT NULL)")
	require.NoError(t, err)
	other := testenv.Reopen(t, db)
	other.SetMaxOpenConns(1)
	c := stmtcache.New(db)
	defer c.Close()

	tx, err := other.BeginTxx(ctx, nil)
	require.NoError(t, err)
	_, err = c.ExecOn(ctx, tx, q("INSERT INTO kv (k, v) VALUES (?, ?)"), "x", 7)
	require.NoError(t, err)
	_, err = c.ExecOn(ctx, tx.Tx, q("INSERT INTO kv (k, v) VALUES (?, ?)"), "y", 8)
	require.NoError(t, err)
	require.NoError(t, tx.Commit())

	_, err = c.Exec(ctx, q("INSERT INTO kv (k, v) VALUES (?, ?)"), "x", 1)
	require.True(t, isDBError(err, true), "duplicate key, got %v", err)

	var v int
	err = c.Get(ctx, &v, q("SELECT v FROM kv WHERE k = ?"), "none")
	require.ErrorIs(t, err, sql.ErrNoRows)
	require.NoError(t, c.Get(ctx, &v, q("SELECT v FROM kv WHERE k = ?"), "y"))
	require.Equal(t, 8, v)

	// A statement that cannot be prepared (missing table) reports the
	// table's error, and works once the table exists.
	_, err = c.Exec(ctx, q("INSERT INTO later (k) VALUES (?)"), "a")
	require.True(t, isDBError(err, false), "no such table, got %v", err)
	_, err = db.ExecContext(ctx, "CREATE TABLE later (k VARCHAR(64) PRIMARY KEY)")
	require.NoError(t, err)
	_, err = c.Exec(ctx, q("INSERT INTO later (k) VALUES (?)"), "a")
	require.NoError(t, err)

	// After Close everything still runs, unprepared.
	c.Close()
	var ks []string
	require.NoError(t, c.Select(ctx, &ks, q("SELECT k FROM kv WHERE v > ? ORDER BY k"), 0))
	require.Equal(t, []string{"x", "y"}, ks)

	var nilCache *stmtcache.Cache
	_, err = nilCache.ExecOn(ctx, db, q("UPDATE kv SET v = v + ? WHERE k = ?"), 1, "x")
	require.NoError(t, err)
}

// Who prepares rmqtx's statements, per database. MariaDB: the cache (a
// *sql.Stmt per statement; TestPreparedOncePerConnection counts the round
// trips). PostgreSQL: pgx, whose default exec mode keeps a statement
// prepared per connection by itself, so the cache prepares nothing and
// runs each statement as given: one prepared statement on the session, the
// driver's, and none under the simple protocol a transaction-pooling
// PgBouncer needs.
func TestWhoPreparesPerDialect(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		testWhoPreparesPerDialect(t, db)
	})
}

func testWhoPreparesPerDialect(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	_, err := db.ExecContext(ctx, "CREATE TABLE kv (k VARCHAR(64) PRIMARY KEY, v INT NOT NULL)")
	require.NoError(t, err)
	const upsert = "INSERT INTO kv (k, v) VALUES ($1, $2) ON CONFLICT (k) DO UPDATE SET v = kv.v + EXCLUDED.v"
	// run executes the upsert three times, twice inside a transaction, and
	// reads the value back.
	run := func(one *sqlx.DB, c *stmtcache.Cache, q string) {
		t.Helper()
		_, err := c.Exec(ctx, q, "a", 1)
		require.NoError(t, err)
		tx, err := one.BeginTxx(ctx, nil)
		require.NoError(t, err)
		for range 2 {
			_, err = c.ExecOn(ctx, tx, q, "a", 1)
			require.NoError(t, err)
		}
		require.NoError(t, tx.Commit())
	}
	if db.DriverName() == "mysql" {
		one := testenv.MySQLVariant(t, db, func(*mysql.Config) {})
		one.SetMaxOpenConns(1)
		c := stmtcache.New(one)
		defer c.Close()
		run(one, c, "INSERT INTO kv (k, v) VALUES (?, ?) ON DUPLICATE KEY UPDATE v = v + VALUES(v)")
		require.Equal(t, 1, c.Len(), "MariaDB: the cache prepared the statement")
		var v int
		require.NoError(t, one.GetContext(ctx, &v, "SELECT v FROM kv WHERE k = 'a'"))
		require.Equal(t, 3, v)
		return
	}
	total := 0
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		one := testenv.PGVariant(t, db, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = mode })
		one.SetMaxOpenConns(1) // pg_prepared_statements is the session's
		c := stmtcache.New(one)
		run(one, c, upsert)
		total += 3
		require.Zero(t, c.Len(), "%s: the cache prepares nothing on pgx", mode)
		var prepared int
		require.NoError(t, one.GetContext(ctx, &prepared, "SELECT COUNT(*) FROM pg_prepared_statements WHERE statement = '"+upsert+"'"))
		want := 1 // pgx's own, reused by all three calls
		if mode == pgx.QueryExecModeSimpleProtocol {
			want = 0
		}
		require.Equal(t, want, prepared, "%s: statements prepared on the session", mode)
		c.Close()
	}
	var v int
	require.NoError(t, db.GetContext(ctx, &v, "SELECT v FROM kv WHERE k = 'a'"))
	require.Equal(t, total, v)
}
