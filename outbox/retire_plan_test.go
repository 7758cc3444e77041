package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqltime"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// A row becomes SENT or DEAD with next_retry_at set to that moment, so a
// retention batch reads the dispatch index in order and reads about one
// batch of rows, however many are past the cutoff (before, it sorted every
// SENT row by updated_at, which no index holds). Rows made terminal before
// that rule, whose next_retry_at is older than their last update, are kept
// until their last update is past the cutoff.
func TestRetireBatchReadsTheDispatchIndex(t *testing.T) {
	eachDB(t, func(t *testing.T, b *bed) {
		ctx := context.Background()
		// The dispatcher stamps next_retry_at when a row becomes terminal.
		ids := b.enqueue(t, Event{EventType: "T", Destination: "sent", Payload: []byte("p")},
			Event{EventType: "T", Destination: "dead", Payload: []byte("p")})
		b.dispatcher(t, Config{Sink: FuncSink(func(_ context.Context, m *Message) error {
			if m.Destination == "dead" {
				return Permanent(errors.New("refused"))
			}
			return nil
		}), PollInterval: 10 * time.Millisecond})
		b.waitStatus(t, StatusSent, 1, 10*time.Second)
		b.waitStatus(t, StatusDead, 1, 10*time.Second)
		for _, id := range ids {
			var r struct {
				Next    sqltime.Time `db:"next_retry_at"`
				Updated sqltime.Time `db:"updated_at"`
			}
			require.NoError(t, b.db.GetContext(ctx, &r, b.db.Rebind("SELECT next_retry_at, updated_at FROM "+b.table.Name()+" WHERE event_id = ?"), id))
			require.True(t, r.Next.Time.Equal(r.Updated.Time), "%s: next_retry_at %v, updated_at %v", id, r.Next.Time, r.Updated.Time)
		}
		b.exec(t, "DELETE FROM "+b.table.Name())

		const rows, legacy, limit = 4000, 30, 20
		base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		cutoff := base.Add(rows * time.Second)
		insert := func(from, to int, id func(int) string, status func(int) Status, next, updated func(int) time.Time) {
			for i := from; i < to; i += 500 {
				var vals []string
				var args []any
				for j := i; j < min(i+500, to); j++ {
					vals = append(vals, "(?, 'T', 'topic', 'p', ?, 0, ?, ?, ?)")
					args = append(args, id(j), string(status(j)), next(j), base, updated(j))
				}
				b.exec(t, "INSERT INTO "+b.table.Name()+" (event_id, event_type, destination, payload, status, retry_count, next_retry_at, created_at, updated_at) VALUES "+
					strings.Join(vals, ", "), args...)
			}
		}
		at := func(j int) time.Time { return base.Add(time.Duration(j) * time.Second) }
		// SENT and DEAD interleaved, each made terminal at its own second.
		insert(0, rows, func(j int) string { return fmt.Sprintf("ob-%05d", j) },
			func(j int) Status {
				if j%5 == 0 {
					return StatusDead
				}
				return StatusSent
			}, at, at)
		// Legacy rows: due long ago, SENT after the cutoff. They must stay.
		insert(0, legacy, func(j int) string { return fmt.Sprintf("legacy-%02d", j) },
			func(int) Status { return StatusSent }, at, func(int) time.Time { return cutoff.Add(time.Hour) })
		testenv.Analyze(t, b.db, b.table.Name())

		rule, err := b.table.retirable(StatusSent, cutoff)
		require.NoError(t, err)
		q, args := rule.SelectOldest(limit)
		q = dialect.Must(b.db).Rebind(q)
		read := testenv.RowsRead(t, b.db, q, args...)
		t.Logf("rows read for a batch of %d among %d SENT rows past the cutoff (and %d legacy rows before them in the index): %d", limit, rows*4/5, legacy, read)
		require.LessOrEqual(t, read, int64(6*limit+3*legacy), "a batch read %d rows", read)

		var got []string
		require.NoError(t, b.db.SelectContext(ctx, &got, q, args...))
		var want []string
		for j := 0; len(want) < limit; j++ {
			if j%5 != 0 {
				want = append(want, fmt.Sprintf("ob-%05d", j))
			}
		}
		require.Equal(t, want, got, "the oldest SENT rows, no legacy row")
		dead, err := b.table.retirable(StatusDead, cutoff)
		require.NoError(t, err)
		dq, dargs := dead.SelectOldest(3)
		require.NoError(t, b.db.SelectContext(ctx, &got, dialect.Must(b.db).Rebind(dq), dargs...))
		require.Equal(t, []string{"ob-00000", "ob-00005", "ob-00010"}, got)
	})
}
