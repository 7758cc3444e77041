package consumer

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqlcount"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// singleConn opens a one-connection pool on db's database with go-sql-driver's
// default DSN (no interpolateParams), so the session counters see every
// statement the processor sends.
func singleConn(t *testing.T, db *sqlx.DB) (*sqlx.DB, *sqlcount.Meter) {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.Load().DSN(testenv.DBName(t, db)))
	require.NoError(t, err)
	cfg.InterpolateParams = false
	one, err := sqlcount.Single(cfg.FormatDSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = one.Close() })
	m, err := sqlcount.NewMeter(context.Background(), one)
	require.NoError(t, err)
	return one, m
}

// preparedHandler is effectHandler with its statement prepared once, as a
// careful user would write it, so the counts below are rmqtx's own.
func preparedHandler(t *testing.T, db *sqlx.DB) Handler {
	st, err := db.Preparex("INSERT INTO effect (event_id, agg_id, version, payload) VALUES (?, ?, ?, ?)")
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	return func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
		_, err := tx.StmtxContext(ctx, st).ExecContext(ctx, ev.ID, ev.AggregateID, ev.AggregateVersion, ev.Payload)
		return err
	}
}

// With the default DSN a first delivery costs BEGIN, the dedup INSERT, the
// handler and COMMIT: one round trip for each of rmqtx's statements. A
// duplicate decided by the database costs BEGIN, the INSERT, ROLLBACK.
func TestProcessRoundTrips(t *testing.T) {
	t.Parallel()
	// MariaDB only: package sqlcount counts round trips with the server's
	// session counters through go-sql-driver. PostgreSQL runs the same
	// statements.
	db := setupDB(t, testenv.MySQLDB(t))
	one, m := singleConn(t, db)
	p := newProc(t, one, func(c *ProcessorConfig) {
		c.Routes = map[string]Route{"Created": {Handler: preparedHandler(t, one)}}
		c.DedupCacheSize = -1 // every duplicate goes to the database
		c.NoCrashCount = true // the counted path's cost: TestCrashCountCost
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	run := func(ids []string) error {
		for _, id := range ids {
			if out := p.Process(ctx, msg(ev(id, "Created"), `{"n":1}`)); out.Result != ResultApplied && out.Result != ResultDuplicate {
				return fmt.Errorf("%s: %s %v", id, out.Result, out.Err)
			}
		}
		return nil
	}
	// Warm-up: the in-transaction statements are prepared in the background
	// after their first use.
	require.NoError(t, run([]string{wire.NewEventID()}))
	testenv.Eventually(t, 10*time.Second, "statements prepared", func() bool {
		c, err := m.Measure(ctx, func() error { return run([]string{wire.NewEventID()}) })
		return err == nil && c.Prepare == 0
	})

	const n = 10
	ids := make([]string, n)
	for i := range ids {
		ids[i] = wire.NewEventID()
	}
	c, err := m.Measure(ctx, func() error { return run(ids) })
	require.NoError(t, err)
	t.Logf("first delivery x%d: %s", n, c)
	require.EqualValues(t, 4*n, c.RoundTrips(), "BEGIN, dedup INSERT, handler INSERT, COMMIT")
	require.Zero(t, c.Prepare)

	c, err = m.Measure(ctx, func() error { return run(ids) })
	require.NoError(t, err)
	t.Logf("duplicate (database) x%d: %s", n, c)
	require.EqualValues(t, 3*n, c.RoundTrips(), "BEGIN, dedup INSERT, ROLLBACK")
	require.EqualValues(t, n, p.Stats().Duplicates)
}

// A first delivery records its dedup row in one statement on each dialect:
// on MySQL the upsert that also answers a duplicate (one Exec); on
// PostgreSQL, where ON CONFLICT DO UPDATE ... RETURNING costs the server
// more than DO NOTHING (scripts/pg-dedup-cost.sh), an insert that skips an
// existing row, with the locking read of the stored hash kept for a
// duplicate.
func TestDedupInsertPerDialect(t *testing.T) {
	t.Parallel()
	tb, err := newTables("rmqtx_")
	require.NoError(t, err)
	my := newQueries(dialect.MySQL, tb)
	require.Empty(t, my.insertLogNew)
	require.Contains(t, my.insertLog, "ON DUPLICATE KEY UPDATE")

	pg := newQueries(dialect.Postgres, tb)
	require.Contains(t, pg.insertLogNew, "INSERT INTO rmqtx_consume_log (consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at)")
	require.True(t, strings.HasSuffix(pg.insertLogNew, "ON CONFLICT (consumer_group, event_id) DO NOTHING"), pg.insertLogNew)
	require.Equal(t, 5, strings.Count(pg.insertLogNew, "$"), "group, id, type, hash, retry count: %s", pg.insertLogNew)
	require.Contains(t, pg.selectLogHash, "FOR SHARE")
}
