package txlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
)

// The store must not force a DSN setting on its users: rows written and
// read through a pool without parseTime carry the same UTC instants.
func TestWorksWithoutParseTime(t *testing.T) {
	t.Parallel()
	s := setup(t)
	cfg, err := mysql.ParseDSN(testenv.Load().DSN(testenv.DBName(t, s.DB())))
	require.NoError(t, err)
	cfg.ParseTime = false
	raw, err := sqlx.Open("mysql", cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = raw.Close() })
	plain, err := txlog.New(raw, txlog.DefaultPrefix)
	require.NoError(t, err)

	ctx := context.Background()
	at := time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC)
	row := committed("no-parse-time")
	row.CreatedAt, row.ResolvedAt = at, at
	require.NoError(t, plain.Insert(ctx, raw, row))

	got, err := plain.Get(ctx, row.EventID)
	require.NoError(t, err)
	require.True(t, at.Equal(got.CreatedAt), "got %s", got.CreatedAt)
	require.Equal(t, time.UTC, got.CreatedAt.Location())
	viaParsed, err := s.Get(ctx, row.EventID)
	require.NoError(t, err)
	require.True(t, viaParsed.ResolvedAt.Equal(got.ResolvedAt))
	require.True(t, got.RecoveredAt.IsZero())
}
