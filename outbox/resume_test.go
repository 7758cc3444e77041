package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"
	_ "time/tzdata" // a DSN location below, whatever the machine's zoneinfo

	"github.com/go-sql-driver/mysql"
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
	b := newBed(t)
	ctx := context.Background()
	base, err := mysql.ParseDSN(testenv.Load().DSN(testenv.DBName(t, b.db)))
	require.NoError(t, err)
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	require.NoError(t, err)
	for _, v := range []struct {
		name string
		set  func(c *mysql.Config)
	}{
		{"parseTime UTC", func(c *mysql.Config) {}},
		{"text", func(c *mysql.Config) { c.ParseTime = false }},
		{"parseTime Tokyo", func(c *mysql.Config) { c.Loc = tokyo }},
		{"interpolated text", func(c *mysql.Config) { c.ParseTime, c.InterpolateParams = false, true }},
		{"interpolated Tokyo", func(c *mysql.Config) { c.Loc, c.InterpolateParams = tokyo, true }},
	} {
		t.Run(v.name, func(t *testing.T) {
			cfg := base.Clone()
			v.set(cfg)
			db, err := sqlx.Open("mysql", cfg.FormatDSN())
			require.NoError(t, err)
			defer db.Close()
			topic := testenv.Name(t, "t")
			ids := b.enqueue(t, events(topic, 4)...)
			for i, id := range ids { // due one after the other, with microseconds
				_, err := b.db.Exec("UPDATE "+b.table.Name()+" SET next_retry_at = ? WHERE event_id = ?",
					fmt.Sprintf("2020-01-01 00:00:0%d.12345%d", i, i), id)
				require.NoError(t, err)
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
				_, err = b.db.Exec("UPDATE "+b.table.Name()+" SET next_retry_at = ? WHERE event_id = ?",
					fmt.Sprintf("2020-01-01 00:00:0%d.12345%d", i, i), id)
				require.NoError(t, err)
			}

			resumed, err := q.claimWith(ctx, db, "R.2", 2, time.Minute, pendingOnly, first.last)
			require.NoError(t, err)
			require.Equal(t, []string{ids[1], ids[2]}, claimedIDs(resumed.rows), "resume at row 1, not before, not after")

			fromStart, err := q.claimWith(ctx, db, "R.3", 2, time.Minute, pendingOnly, nil)
			require.NoError(t, err)
			require.Equal(t, []string{ids[0], ids[3]}, claimedIDs(fromStart.rows))
			_, err = b.db.Exec("UPDATE "+b.table.Name()+" SET status = 'SENT' WHERE event_id IN (?, ?, ?, ?)", ids[0], ids[1], ids[2], ids[3])
			require.NoError(t, err)
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
	b := newBed(t)
	ctx := context.Background()
	ids := b.enqueue(t, append(events("a", 3), events("b", 1)...)...)
	_, err := b.db.Exec("UPDATE "+b.table.Name()+" SET created_at = '2020-01-01 00:00:00' WHERE event_id = ?", ids[1])
	require.NoError(t, err)
	_, err = b.db.Exec("UPDATE "+b.table.Name()+" SET status = 'SENDING' WHERE event_id = ?", ids[2])
	require.NoError(t, err)
	_, err = b.db.Exec("UPDATE "+b.table.Name()+" SET status = 'SENT' WHERE event_id = ?", ids[3])
	require.NoError(t, err)

	got, err := b.table.Backlog(ctx, b.db)
	require.NoError(t, err)
	require.Len(t, got, 1, "destination b has nothing unsent")
	require.Equal(t, "a", got[0].Destination)
	require.EqualValues(t, 2, got[0].Pending)
	require.EqualValues(t, 1, got[0].Sending)
	require.Greater(t, got[0].OldestAge, time.Since(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC))-24*time.Hour,
		"the oldest row's age, from its created_at")
}
