package testenv

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// RowsRead runs query once and returns how many index and table rows the
// database says it read to answer it, from its own counters: MariaDB's
// session Handler_read_* counters around the query (on one connection, less
// what reading the counters itself adds), PostgreSQL's EXPLAIN ANALYZE (the
// rows every scan node returned and removed by its filter, times its
// loops). A test bounds it to prove that a query reads an index range
// rather than every matching row.
func RowsRead(t testing.TB, db *sqlx.DB, query string, args ...any) int64 {
	t.Helper()
	ctx := context.Background()
	if db.DriverName() == "pgx" || db.DriverName() == "postgres" {
		var plan string
		require.NoError(t, db.GetContext(ctx, &plan, "EXPLAIN (ANALYZE, FORMAT JSON) "+query, args...))
		var root []struct {
			Plan pgPlan `json:"Plan"`
		}
		require.NoError(t, json.Unmarshal([]byte(plan), &root))
		require.Len(t, root, 1)
		return root[0].Plan.rowsRead()
	}
	conn, err := db.Connx(ctx)
	require.NoError(t, err)
	defer conn.Close()
	counters := func() int64 {
		var rows []struct {
			Name  string `db:"Variable_name"`
			Value string `db:"Value"`
		}
		require.NoError(t, conn.SelectContext(ctx, &rows, "SHOW SESSION STATUS LIKE 'Handler_read%'"))
		var n int64
		for _, r := range rows {
			v, err := strconv.ParseInt(r.Value, 10, 64)
			require.NoError(t, err)
			n += v
		}
		return n
	}
	a := counters()
	b := counters()
	overhead := b - a // what one SHOW adds
	rows, err := conn.QueryxContext(ctx, query, args...)
	require.NoError(t, err)
	for rows.Next() {
	}
	require.NoError(t, rows.Err())
	require.NoError(t, rows.Close())
	c := counters()
	return c - b - overhead
}

// Analyze refreshes table's statistics (MariaDB's ANALYZE TABLE,
// PostgreSQL's ANALYZE), so a test's bulk-loaded rows get the plan a grown
// table would.
func Analyze(t testing.TB, db *sqlx.DB, table string) {
	t.Helper()
	q := "ANALYZE " + table
	if db.DriverName() == "mysql" {
		q = "ANALYZE TABLE " + table
	}
	_, err := db.ExecContext(context.Background(), q)
	require.NoError(t, err)
}

// PGPagesRead runs query once on PostgreSQL and returns the buffer pages
// it touched (EXPLAIN (ANALYZE, BUFFERS): shared blocks hit and read). It
// sees what RowsRead cannot there: an index scan whose condition is not on
// the index's first column reports only the entries it returned, yet walks
// every leaf page.
func PGPagesRead(t testing.TB, db *sqlx.DB, query string, args ...any) int64 {
	t.Helper()
	var plan string
	require.NoError(t, db.GetContext(context.Background(), &plan, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+query, args...))
	var root []struct {
		Plan pgPlan `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal([]byte(plan), &root))
	require.Len(t, root, 1)
	return int64(root[0].Plan.SharedHit + root[0].Plan.SharedRead)
}

type pgPlan struct {
	SharedHit     float64  `json:"Shared Hit Blocks"`
	SharedRead    float64  `json:"Shared Read Blocks"`
	NodeType      string   `json:"Node Type"`
	ActualRows    float64  `json:"Actual Rows"`
	ActualLoops   float64  `json:"Actual Loops"`
	RemovedFilter float64  `json:"Rows Removed by Filter"`
	Plans         []pgPlan `json:"Plans"`
}

func (p pgPlan) rowsRead() int64 {
	var n int64
	if len(p.NodeType) > 4 && p.NodeType[len(p.NodeType)-4:] == "Scan" {
		n += int64((p.ActualRows + p.RemovedFilter) * p.ActualLoops)
	}
	for _, c := range p.Plans {
		n += c.rowsRead()
	}
	return n
}
