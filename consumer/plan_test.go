package consumer

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
)

// A consume-log retention batch reads the updated_at index in order and
// stops after about one batch of rows, however many dedup records are past
// the cutoff (rows still PROCESSING are read and skipped, never removed).
func TestRetireConsumeLogReadsOneBatch(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sqlx.DB) {
		ctx := context.Background()
		tn, err := Tables("")
		require.NoError(t, err)
		const rows, limit = 4000, 20
		base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		for i := 0; i < rows; i += 500 {
			var vals []string
			var args []any
			for j := i; j < i+500; j++ {
				st := StatusApplied
				switch j % 10 {
				case 3:
					st = StatusStale
				case 7:
					st = "PROCESSING"
				}
				at := base.Add(time.Duration(j) * time.Second)
				vals = append(vals, "(?, ?, 'T', REPEAT('a', 64), ?, ?, ?)")
				args = append(args, fmt.Sprintf("g%d", j%3), fmt.Sprintf("ev-%05d", j), st, at, at)
			}
			exec(t, db, "INSERT INTO "+tn.ConsumeLog+" (consumer_group, event_id, event_type, request_hash, status, first_received_at, updated_at) VALUES "+
				strings.Join(vals, ", "), args...)
		}
		testenv.Analyze(t, db, tn.ConsumeLog)

		rule, err := tn.retirable(RetireConsumeLog, base.Add(rows*time.Second))
		require.NoError(t, err)
		q, args := rule.SelectOldest(limit)
		q = dialect.Must(db).Rebind(q)
		read := testenv.RowsRead(t, db, q, args...)
		t.Logf("rows read for a batch of %d among %d rows past the cutoff: %d", limit, rows, read)
		require.LessOrEqual(t, read, int64(6*limit), "a batch read %d rows", read)
		var got []struct {
			Group string `db:"consumer_group"`
			Event string `db:"event_id"`
		}
		require.NoError(t, db.SelectContext(ctx, &got, q, args...))
		require.Len(t, got, limit)
		for i, want := 0, 0; i < limit; i, want = i+1, want+1 {
			if want%10 == 7 {
				want++ // PROCESSING: never selected
			}
			require.Equal(t, fmt.Sprintf("ev-%05d", want), got[i].Event, "oldest first")
		}
	})
}

// Inspecting an event reads a few rows per consumer group, however large
// the consume log and the attempts grow: both primary keys start with the
// group, so the lookup walks the groups and reads (group, event) in each.
func TestByEventReadsTheGroupsNotTheTable(t *testing.T) {
	eachDB(t, func(t *testing.T, db *sqlx.DB) {
		ctx := context.Background()
		tn, err := Tables("")
		require.NoError(t, err)
		at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		// 200 000 rows: on a small table PostgreSQL rightly prefers one
		// sequential scan to a lookup per group (its estimate for the
		// group walk is 101 rows); at this size it no longer does.
		const rows = 200000
		gen, n := "seq_0_to_199999", "seq"
		if db.DriverName() != "mysql" {
			gen, n = "generate_series(0, 199999) s", "s"
		}
		ev := "CONCAT('ev-', LPAD(CAST(" + n + " DIV 2 AS CHAR), 5, '0'))"
		grp := "CONCAT('g', CAST(MOD(" + n + ", 4) AS CHAR))"
		if db.DriverName() != "mysql" {
			ev = "'ev-' || LPAD((" + n + " / 2)::text, 5, '0')"
			grp = "'g' || (" + n + " % 4)::text"
		}
		exec(t, db, "INSERT INTO "+tn.ConsumeLog+" (consumer_group, event_id, event_type, request_hash, status, first_received_at, updated_at) SELECT "+
			grp+", "+ev+", 'T', REPEAT('a', 64), 'SUCCESS', ?, ? FROM "+gen, at, at)
		exec(t, db, "INSERT INTO "+tn.Attempt+" (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at) SELECT "+
			grp+", "+ev+", 2, 'transient', 'e', ?, ? FROM "+gen, at, at)
		for _, tb := range []string{tn.ConsumeLog, tn.Attempt} {
			testenv.Analyze(t, db, tb)
		}
		// ev-00777 is rows 1554 (g2) and 1555 (g3).
		logs, err := tn.ConsumeLogByEvent(ctx, db, "ev-00777")
		require.NoError(t, err)
		require.Len(t, logs, 2)
		require.Equal(t, "g2", logs[0].ConsumerGroup)
		require.Equal(t, "g3", logs[1].ConsumerGroup)
		tries, err := tn.AttemptsByEvent(ctx, db, "ev-00777")
		require.NoError(t, err)
		require.Len(t, tries, 2)
		require.Equal(t, "ev-00777", tries[1].EventID)

		d := dialect.Must(db)
		for _, c := range []struct{ table, cols string }{{tn.ConsumeLog, consumeLogColumns}, {tn.Attempt, attemptColumns}} {
			// MariaDB counts rows; PostgreSQL's plan does not count index
			// entries a scan skips, so there the measure is pages touched.
			measure, unit, bound, scan := testenv.RowsRead, "rows", int64(40), int64(rows)
			if db.DriverName() != "mysql" {
				measure, unit, bound, scan = testenv.PGPagesRead, "pages", 60, 500
			}
			read := measure(t, db, byEvent(d, c.table, c.cols), "ev-00777")
			t.Logf("%s: %s read for one event among %d rows in 4 groups: %d", c.table, unit, rows, read)
			require.LessOrEqual(t, read, bound, "%s: the lookup read %d %s", c.table, read, unit)
			whole := measure(t, db, d.Rebind("SELECT "+c.cols+" FROM "+c.table+" WHERE event_id = ? ORDER BY consumer_group"), "ev-00777")
			t.Logf("%s: with event_id alone: %d %s", c.table, whole, unit)
			require.GreaterOrEqual(t, whole, scan, "the counters see a filter on event_id alone scan the table")
		}
	})
}
