package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// The duplicate decision must rest on committed rows only, whatever the
// session's isolation level. The processor's pool runs READ UNCOMMITTED (a
// DSN session parameter; the server's GLOBAL level is left alone). Another
// transaction inserts the dedup row of a fresh event and stays open: a
// dirty read of that row must not make the processor ACK the event as a
// duplicate, for that transaction then rolls back and the event would be
// lost. The processor must wait for it and apply the event; had the other
// transaction committed, the event would be a duplicate. Both the
// duplicate-storm pre-read and the one-statement check are exercised.
func TestDedupIgnoresUncommittedRowsAtReadUncommitted(t *testing.T) {
	t.Parallel()
	db := setupDB(t)
	ru := testenv.ReadUncommittedDB(t, db)
	name := testenv.DBName(t, db)
	for _, storm := range []bool{true, false} {
		for _, otherCommits := range []bool{false, true} {
			p := newProc(t, ru, func(c *ProcessorConfig) { c.DedupCacheSize = -1 })
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
			_, err = other.Exec("INSERT INTO rmqtx_consume_log (consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at)"+
				" VALUES (?, ?, 'Created', ?, 'SUCCESS', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", p.Config().Group, id, wire.Hash(m.Body))
			require.NoError(t, err)

			pctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			done := make(chan Outcome, 1)
			go func() { done <- p.Process(pctx, m) }()
			// Wait until the processor either answered (it must not, yet) or
			// is waiting on the other transaction's row lock. PROCESSLIST
			// shows the waiting statement of this database.
			var early *Outcome
			testenv.Eventually(t, 30*time.Second, "the processor waits on the open transaction", func() bool {
				select {
				case o := <-done:
					early = &o
					return true
				default:
				}
				return countRows(t, db, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = ? AND INFO LIKE 'INSERT INTO rmqtx_consume_log%'", name) > 0
			})
			if early != nil {
				_ = other.Rollback()
				cancel()
				t.Fatalf("storm=%v: answered %s while the dedup row was uncommitted", storm, early.Result)
			}
			if otherCommits {
				require.NoError(t, other.Commit())
			} else {
				require.NoError(t, other.Rollback())
			}
			o := <-done
			cancel()
			if otherCommits {
				require.Equal(t, ResultDuplicate, o.Result, "storm=%v: the committed row makes it a duplicate", storm)
				require.Equal(t, before, effects(t, db))
			} else {
				require.Equal(t, ResultApplied, o.Result, "storm=%v: the rolled-back row is not a duplicate: %v", storm, o.Err)
				require.Equal(t, before+1, effects(t, db))
				require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE consumer_group = ? AND event_id = ?", p.Config().Group, id))
			}
		}
	}
}
