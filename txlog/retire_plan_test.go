package txlog_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
)

// A retention batch reads about one batch of rows, however many rows are
// past the cutoff: with both terminal states in one "state IN (...)", no
// index yields them in resolved_at order, and each batch sorted every
// eligible row (72 ms a batch at 400 k rows). The rule reads one index
// range per state instead; the databases' own counters bound what it reads,
// and the rows it picks are still the oldest across both states.
func TestRetireBatchReadsOneBatch(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		ctx := context.Background()
		require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
		s, err := txlog.New(db, txlog.DefaultPrefix)
		require.NoError(t, err)
		const rows, limit = 4000, 20
		base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		// Every 7th row is a rollback, interleaved in time with the commits.
		for i := 0; i < rows; i += 500 {
			var vals []string
			var args []any
			for j := i; j < i+500; j++ {
				st := txlog.StateCommitted
				if j%7 == 0 {
					st = txlog.StateRolledBack
				}
				at := base.Add(time.Duration(j) * time.Second)
				vals = append(vals, "(?, ?, ?, ?, 'LOCAL_COMMIT')")
				args = append(args, fmt.Sprintf("ev-%05d", j), string(st), at, at)
			}
			_, err := db.ExecContext(ctx, db.Rebind("INSERT INTO "+s.Table()+" (event_id, state, created_at, resolved_at, resolved_by) VALUES "+
				strings.Join(vals, ", ")), args...)
			require.NoError(t, err)
		}
		testenv.Analyze(t, db, s.Table())

		rule := txlog.Retirable(s, base.Add(rows*time.Second))
		q, args := rule.SelectOldest(limit)
		q = dialect.Must(db).Rebind(q)
		read := testenv.RowsRead(t, db, q, args...)
		t.Logf("rows read for a batch of %d among %d eligible: %d", limit, rows, read)
		require.LessOrEqual(t, read, int64(6*limit), "a batch of %d read %d rows of %d eligible", limit, read, rows)
		// The counters see a scan of the eligible rows: the same rule as
		// one predicate reads them all.
		whole := rule
		whole.Parts = nil
		wq, wargs := whole.SelectOldest(limit)
		wread := testenv.RowsRead(t, db, dialect.Must(db).Rebind(wq), wargs...)
		t.Logf("as one predicate: %d", wread)
		require.GreaterOrEqual(t, wread, int64(rows), "the counters must see the sort's scan")

		var got []string
		require.NoError(t, db.SelectContext(ctx, &got, q, args...))
		var want []string
		for j := range limit {
			want = append(want, fmt.Sprintf("ev-%05d", j))
		}
		require.Equal(t, want, got, "the oldest rows across both states, oldest first")

		removed, _, more, err := s.RetireBatch(ctx, base.Add(rows*time.Second), limit, "")
		require.NoError(t, err)
		require.Equal(t, int64(limit), removed)
		require.True(t, more)
		_, err = s.Get(ctx, "ev-00000")
		require.ErrorIs(t, err, txlog.ErrNotFound)
		_, err = s.Get(ctx, fmt.Sprintf("ev-%05d", limit))
		require.NoError(t, err, "the row after the batch stays")
	})
}
