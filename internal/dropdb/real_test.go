package dropdb_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dropdb"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// On the real servers: a database with a session still connected to it,
// as a run that failed leaves one, is dropped, and is gone afterwards.
func TestDropWithASessionLeftInIt(t *testing.T) {
	s := testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		pg := db.DriverName() != "mysql"
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		name := "rmqtx_drop_" + testenv.RandSuffix(10)
		_, err := db.ExecContext(ctx, "CREATE DATABASE "+name)
		require.NoError(t, err)
		t.Cleanup(func() { _ = dropdb.Drop(context.Background(), db, name, pg) })

		var left *sqlx.DB
		if pg {
			cfg, err := pgx.ParseConfig(testenv.PGDSN())
			require.NoError(t, err)
			cfg.Database = name
			left = sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx")
		} else {
			left, err = sqlx.Open("mysql", s.DSN(name))
			require.NoError(t, err)
		}
		defer left.Close()
		require.NoError(t, left.PingContext(ctx))
		sessions := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ?"
		exists := "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?"
		if pg {
			sessions = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = $1"
			exists = "SELECT COUNT(*) FROM pg_database WHERE datname = $1"
		}
		var n int
		require.NoError(t, db.GetContext(ctx, &n, sessions, name))
		require.Positive(t, n, "a session is connected to the database")

		require.NoError(t, dropdb.Drop(ctx, db, name, pg))
		require.NoError(t, db.GetContext(ctx, &n, exists, name))
		require.Zero(t, n, "the database is gone")
	})
}
