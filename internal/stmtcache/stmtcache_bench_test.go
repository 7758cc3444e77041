//go:build unix

package stmtcache_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// BenchmarkTxExec measures the client's side of one rmqtx statement in a
// transaction on PostgreSQL, the way the cache runs it now (as given: pgx
// prepares it per connection) against a database/sql prepared statement
// (what the cache did before, and still does on MariaDB): BEGIN, the
// statement, COMMIT on a one-connection pool. client-µs/op is the bench
// process's CPU (getrusage) per transaction; the two differ only in the
// statement's path through database/sql.
//
//	go test -run '^$' -bench TxExec -benchtime 20000x -count 6 ./internal/stmtcache
func BenchmarkTxExec(b *testing.B) {
	db := testenv.PostgresDB(b)
	ctx := context.Background()
	_, err := db.ExecContext(ctx, "CREATE TABLE kv (k BIGINT PRIMARY KEY, a VARCHAR(64) NOT NULL, b VARCHAR(64) NOT NULL)")
	require.NoError(b, err)
	const insert = "INSERT INTO kv (k, a, b) VALUES ($1, $2, $3) ON CONFLICT (k) DO NOTHING"
	one := testenv.PGVariant(b, db, func(*pgx.ConnConfig) {})
	one.SetMaxOpenConns(1)
	st, err := one.PreparexContext(ctx, insert)
	require.NoError(b, err)
	defer func() { _ = st.Close() }()
	c := stmtcache.New(one)
	var k int64
	for _, path := range []string{"as-given", "sql-stmt"} {
		b.Run(path, func(b *testing.B) {
			cpu0 := processCPU()
			for b.Loop() {
				k++
				tx, err := one.BeginTxx(ctx, nil)
				require.NoError(b, err)
				if path == "as-given" {
					_, err = c.TxExec(ctx, tx, insert, k, "consumer-group", "event-id")
				} else {
					ts := tx.StmtxContext(ctx, st)
					_, err = ts.ExecContext(ctx, k, "consumer-group", "event-id")
					_ = ts.Close()
				}
				require.NoError(b, err)
				require.NoError(b, tx.Commit())
			}
			b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N), "client-µs/op")
		})
	}
}

// processCPU is this process's user and system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
