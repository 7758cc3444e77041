package consumer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// The duplicate decision must rest on committed rows only, whatever the
// isolation level the processor's sessions default to (a DSN session
// parameter; the server's global level is left alone), on each database.
// Another transaction inserts the dedup row of a fresh event and stays
// open: a dirty read of that row (MariaDB at READ UNCOMMITTED) must not make
// the processor ACK the event as a duplicate, for that transaction then
// rolls back and the event would be lost. The processor must wait for it:
// once it rolls back, the event is applied; once it commits, the event is a
// duplicate. PostgreSQL at REPEATABLE READ or SERIALIZABLE cannot see a row
// committed after its transaction's snapshot, so there the waiting delivery
// fails with a serialization failure instead: a retry, with nothing applied,
// whose redelivery is the duplicate. Both the duplicate-storm pre-read and
// the one-statement check are exercised.
func TestDedupDecidesOnCommittedRowsAtEveryIsolation(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *sqlx.DB) {
		for _, level := range testenv.IsolationLevels {
			t.Run(level, func(t *testing.T) { testDedupAtIsolation(t, db, level) })
		}
	})
}

func testDedupAtIsolation(t *testing.T, db *sqlx.DB, level string) {
	pool := testenv.SessionIsolationDB(t, db, level)
	// PostgreSQL's REPEATABLE READ and SERIALIZABLE fail a statement that
	// waited on a row committed after the transaction's snapshot.
	snapshotFails := db.DriverName() != "mysql" && (level == testenv.RepeatableRead || level == testenv.Serializable)
	for _, storm := range []bool{true, false} {
		for _, otherCommits := range []bool{false, true} {
			name := fmt.Sprintf("storm=%v commits=%v", storm, otherCommits)
			p := newProc(t, pool, func(c *ProcessorConfig) { c.DedupCacheSize = -1 })
			ctx := context.Background()
			if storm {
				// 64 database dedup hits put the processor in storm mode.
				warm := wire.NewEventID()
				require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(warm, "Created"), "warm")).Result)
				for range 64 {
					require.Equal(t, ResultDuplicate, p.Process(ctx, msg(ev(warm, "Created"), "warm")).Result)
				}
				require.True(t, p.dups.storm())
			}
			before := effects(t, db)

			id := wire.NewEventID()
			m := msg(ev(id, "Created"), "payload-"+id)
			other, err := db.BeginTxx(ctx, nil)
			require.NoError(t, err)
			now := time.Now().UTC()
			_, err = other.Exec(other.Rebind("INSERT INTO rmqtx_consume_log (consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at)"+
				" VALUES (?, ?, 'Created', ?, 'SUCCESS', 0, ?, ?)"), p.Config().Group, id, wire.Hash(m.Body), now, now)
			require.NoError(t, err)

			pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			done := make(chan Outcome, 1)
			go func() { done <- p.Process(pctx, m) }()
			// Wait until the processor either answered (it must not, yet) or
			// is waiting on the other transaction's row lock.
			var early *Outcome
			testenv.Eventually(t, 30*time.Second, "the processor waits on the open transaction", func() bool {
				select {
				case o := <-done:
					early = &o
					return true
				default:
				}
				n, err := testenv.LockWaiters(db, "INSERT INTO rmqtx_consume_log")
				require.NoError(t, err)
				return n > 0
			})
			if early != nil {
				_ = other.Rollback()
				cancel()
				t.Fatalf("%s: answered %s while the dedup row was uncommitted", name, early.Result)
			}
			if otherCommits {
				require.NoError(t, other.Commit())
			} else {
				require.NoError(t, other.Rollback())
			}
			o := <-done
			cancel()
			switch {
			case !otherCommits:
				require.Equal(t, ResultApplied, o.Result, "%s: the rolled-back row is not a duplicate: %v", name, o.Err)
				require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE consumer_group = ? AND event_id = ?", p.Config().Group, id))
			case snapshotFails:
				require.Equal(t, ResultRetry, o.Result, "%s: %v", name, o.Err)
				require.True(t, dialect.RolledBack(o.Err), "%s: a serialization failure, got %v", name, o.Err)
				redelivered := m
				redelivered.Delivery.ReconsumeTimes = 1
				require.Equal(t, ResultDuplicate, p.Process(ctx, redelivered).Result, "%s: the redelivery", name)
				require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE consumer_group = ? AND event_id = ?", p.Config().Group, id),
					"%s: the duplicate cleared the failed attempt", name)
			default:
				require.Equal(t, ResultDuplicate, o.Result, "%s: the committed row makes it a duplicate: %v", name, o.Err)
			}
			want := before
			if !otherCommits {
				want++
			}
			require.Equal(t, want, effects(t, db), "%s: one effect, or none", name)
		}
	}
}
