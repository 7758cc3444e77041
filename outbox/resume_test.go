package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"
	_ "time/tzdata" // a DSN location below, whatever the machine's zoneinfo

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// The PENDING step's resume point goes back to the database as the driver
// returned it, so it compares equal to the stored next_retry_at whatever
// the DSN does with times: the row it names is read again, the rows before
// it are skipped.
func TestClaimResumesExactlyWhereItStopped(t *testing.T) {
	t.Parallel()
	eachDB(t, testClaimResumesExactlyWhereItStopped)
}

func testClaimResumesExactlyWhereItStopped(t *testing.T, b *bed) {
	ctx := context.Background()
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	// The DSN variants of each database: how its driver hands times back
	// and sends them.
	type variant struct {
		name string
		open func() *sqlx.DB
	}
	my := func(name string, set func(c *mysql.Config)) variant {
		return variant{name, func() *sqlx.DB { return testenv.MySQLVariant(t, b.db, set) }}
	}
	pg := func(name string, set func(c *pgx.ConnConfig)) variant {
		return variant{name, func() *sqlx.DB { return testenv.PGVariant(t, b.db, set) }}
	}
	variants := []variant{
		my("parseTime UTC", func(c *mysql.Config) {}),
		my("text", func(c *mysql.Config) { c.ParseTime = false }),
		my("parseTime Tokyo", func(c *mysql.Config) { c.Loc = tokyo }),
		my("interpolated text", func(c *mysql.Config) { c.ParseTime, c.InterpolateParams = false, true }),
		my("interpolated Tokyo", func(c *mysql.Config) { c.Loc, c.InterpolateParams = tokyo, true }),
	}
	if b.db.DriverName() != "mysql" {
		variants = []variant{
			pg("extended UTC", func(c *pgx.ConnConfig) { c.RuntimeParams["timezone"] = "UTC" }),
			pg("extended Tokyo", func(c *pgx.ConnConfig) { c.RuntimeParams["timezone"] = "Asia/Tokyo" }),
			pg("simple protocol Tokyo", func(c *pgx.ConnConfig) {
				c.RuntimeParams["timezone"] = "Asia/Tokyo"
				c.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
			}),
			pg("exec mode", func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = pgx.QueryExecModeExec }),
		}
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			db := v.open()
			topic := testenv.Name(t, "t")
			ids := b.enqueue(t, events(topic, 4)...)
			for i, id := range ids { // due one after the other, with microseconds
				b.exec(t, "UPDATE "+b.table.Name()+" SET next_retry_at = ? WHERE event_id = ?",
					fmt.Sprintf("2020-01-01 00:00:0%d.12345%d", i, i), id)
			}
			q := newQueries(dialect.Must(db), b.table.Name())
			q.stmts = stmtcache.New(db) // prepared, as a dispatcher runs them
			defer q.stmts.Close()
			pendingOnly := stepSet{stepPending: true}

			first, err := q.claimWith(ctx, db, "R.1", 2, time.Minute, pendingOnly, nil)
			require.NoError(t, err)
			require.Equal(t, []string{ids[0], ids[1]}, claimedIDs(first.rows))
			require.True(t, first.full[stepPending])
			require.NotNil(t, first.last)
			for i, id := range ids[:2] { // both due again, before and at the resume point
				n, err := q.release(ctx, id, "R.1")
				require.NoError(t, err)
				require.EqualValues(t, 1, n)
				b.exec(t, "UPDATE "+b.table.Name()+" SET next_retry_at = ? WHERE event_id = ?",
					fmt.Sprintf("2020-01-01 00:00:0%d.12345%d", i, i), id)
			}

			resumed, err := q.claimWith(ctx, db, "R.2", 2, time.Minute, pendingOnly, first.last)
			require.NoError(t, err)
			require.Equal(t, []string{ids[1], ids[2]}, claimedIDs(resumed.rows), "resume at row 1, not before, not after")

			fromStart, err := q.claimWith(ctx, db, "R.3", 2, time.Minute, pendingOnly, nil)
			require.NoError(t, err)
			require.Equal(t, []string{ids[0], ids[3]}, claimedIDs(fromStart.rows))
			b.exec(t, "UPDATE "+b.table.Name()+" SET status = 'SENT' WHERE event_id IN (?, ?, ?, ?)", ids[0], ids[1], ids[2], ids[3])
		})
	}
}

func claimedIDs(rows []claimedRow) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.EventID
	}
	return out
}

// Backlog counts unsent rows per destination and measures the oldest on the
// database's clock.
func TestBacklog(t *testing.T) {
	t.Parallel()
	eachDB(t, testBacklog)
}

func testBacklog(t *testing.T, b *bed) {
	ctx := context.Background()
	ids := b.enqueue(t, append(events("a", 3), events("b", 1)...)...)
	b.exec(t, "UPDATE "+b.table.Name()+" SET created_at = ? WHERE event_id = ?", time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC), ids[1])
	b.exec(t, "UPDATE "+b.table.Name()+" SET status = 'SENDING' WHERE event_id = ?", ids[2])
	b.exec(t, "UPDATE "+b.table.Name()+" SET status = 'SENT' WHERE event_id = ?", ids[3])

	got, err := b.table.Backlog(ctx, b.db)
	require.NoError(t, err)
	require.Len(t, got, 1, "destination b has nothing unsent")
	require.Equal(t, "a", got[0].Destination)
	require.EqualValues(t, 2, got[0].Pending)
	require.EqualValues(t, 1, got[0].Sending)
	require.Greater(t, got[0].OldestAge, time.Since(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))-24*time.Hour,
		"the oldest row's age, from its created_at")
}
