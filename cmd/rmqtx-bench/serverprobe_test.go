package main

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// The probe finds the database server by its port and charges it the CPU
// of a round of point reads; on MariaDB it also reads InnoDB's counters,
// which see at least one page and one row per read. The counters are
// global (other tests' work adds to them), so only lower bounds hold.
func TestServerProbeCountsTheDatabasesWork(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, testServerProbeCountsTheDatabasesWork)
}

func testServerProbeCountsTheDatabasesWork(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := javaTestEnv(t, db)
	table := "bench_" + e.Names.Run() + "_probe"
	_, err := db.ExecContext(ctx, "CREATE TABLE "+table+" (id BIGINT PRIMARY KEY, v VARCHAR(64) NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE " + table) })
	for i := 0; i < 1000; i += 100 {
		q := "INSERT INTO " + table + " (id, v) VALUES "
		for j := i; j < i+100; j++ {
			if j > i {
				q += ","
			}
			q += fmt.Sprintf("(%d, 'v%d')", j, j)
		}
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}

	p := newServerProbe(e, db)
	require.NotZero(t, p.meter.dbPID, "the database's process is found by its port")
	const reads = 3000
	snap := p.begin(ctx)
	read := db.Rebind("SELECT v FROM " + table + " WHERE id = ?")
	for i := 0; i < reads; i++ {
		var v string
		require.NoError(t, db.GetContext(ctx, &v, read, i%1000))
		require.Equal(t, fmt.Sprintf("v%d", i%1000), v)
	}
	r := Round{Count: reads}
	p.end(ctx, snap, &r)

	require.Positive(t, r.Extra[probeCPUDB], "the database spent CPU on the reads")
	require.Positive(t, r.Extra[probeCPUBench])
	busy := r.Extra[probeCoresBusy]
	require.True(t, busy > 0 && busy <= 1.5, "cores busy %v", busy)
	if e.S.Engine == engineMySQL {
		require.GreaterOrEqual(t, r.Extra[probePoolReqs], 1.0, "a point read looks up at least one page")
		require.GreaterOrEqual(t, r.Extra[probeRowsRead], 1.0, "a point read reads its row through the handler")
		require.Contains(t, probeLine([]Round{r}), "InnoDB/op pages ")
	} else {
		require.NotContains(t, r.Extra, probePoolReqs, "no InnoDB counters on PostgreSQL")
	}
	require.Contains(t, r.Extra, probeLogBytes, "the redo or WAL position is read on both databases")
	// Writes move it: a round of inserts writes log bytes.
	snap = p.begin(ctx)
	for i := 1000; i < 1100; i++ {
		_, err := db.ExecContext(ctx, db.Rebind("INSERT INTO "+table+" (id, v) VALUES (?, ?)"), i, "w")
		require.NoError(t, err)
	}
	w := Round{Count: 100}
	p.end(ctx, snap, &w)
	require.Positive(t, w.Extra[probeLogBytes], "inserts write redo / WAL")
	require.Contains(t, probeLine([]Round{r}), "cpu µs/op bench ")
	m := probeMedians([]Round{r})
	require.False(t, math.IsNaN(m[probeCPUDB]))
	require.Nil(t, probeMedians([]Round{{Count: 1}}), "no figures, no map")
}
