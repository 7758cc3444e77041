package txproducer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// A producer whose database connection black-holes (no reset: the sockets
// stay open and nothing flows, testenv.DBHole) while its Send's local
// transaction is open, holding the txlog row's lock: its COMMIT never
// reaches the server, and the server keeps the session and the lock. The
// broker's checks, answered by a second instance of the group on a healthy
// pool, cannot decide while the lock is held (every answer UNKNOWN, also
// past the fence age, where the fence waits on the lock). Once the server
// ends the session (KILL CONNECTION / pg_terminate_backend, as its own
// timeout would), the transaction is rolled back and the next check fences
// the row: ROLLBACK, by the fence. When the partition heals, the stuck
// Send returns an error, never Committed; a retry with the same id commits
// once. Counted by an independent consumer: one copy, one business row.
func TestBlackHoleHoldingTxlogRowLock(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testBlackHoleHoldingTxlogRowLock)
}

func testBlackHoleHoldingTxlogRowLock(t *testing.T, b *bundle) {
	hole := testenv.NewDBHole(t, b.db)
	cfg := b.config()
	// The driver's own timeout would end the client's wait for the COMMIT
	// answer; the test heals the partition long before it.
	cfg.DB = hole.Pool(t, 2*time.Minute)
	cfg.CheckTimeout = 2 * time.Second // the held instance's checks wait in the hole
	cfg.LocalTxTimeout = 2 * time.Minute
	p := startProducer(t, cfg)
	healthy := startProducer(t, b.config()) // the second instance of the group
	t.Cleanup(hole.Cut)                     // before the Shutdowns, should the test stop early
	ctx := context.Background()
	id := "hole-" + testenv.RandSuffix(8)
	started := time.Now()

	holed := make(chan struct{})
	type outcome struct {
		res txproducer.Result
		err error
		at  time.Duration
	}
	sent := make(chan outcome, 1)
	go func() {
		res, err := p.Send(ctx, b.msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
			if err := insertOrder(id)(ctx, tx); err != nil {
				return err
			}
			hole.BlackHole() // the COMMIT that follows goes nowhere
			close(holed)
			return nil
		})
		sent <- outcome{res, err, time.Since(started)}
	}()
	select {
	case <-holed:
	case o := <-sent:
		t.Fatalf("Send returned before its local transaction ran: %v", o.err)
	}

	// The server still holds the transaction: its business row is locked.
	require.True(t, testenv.LockedOut(t, b.db, "INSERT INTO orders (id, amount) VALUES (?, 2)", id),
		"the black-holed session no longer holds its rows")
	// A check past the fence age has met the lock and could not decide.
	b.rec.waitT(t, id, "a check answer past the fence age", func(as []checkback.Answer) bool {
		for _, a := range as {
			if a.Age >= testFenceAge {
				return true
			}
		}
		return false
	})
	for _, a := range b.rec.get(id) {
		require.Equal(t, checkback.Unknown, a.Decision, "decided while the lock was held: %+v", a)
	}
	require.True(t, testenv.LockedOut(t, b.db, "INSERT INTO orders (id, amount) VALUES (?, 2)", id))

	ended := hole.EndSessions(t)
	require.Positive(t, ended, "no server session behind the proxy")
	t.Logf("server ended %d session(s) at %s", ended, time.Since(started).Round(time.Millisecond))

	row := b.waitRow(t, id, txlog.StateRolledBack)
	require.Equal(t, txlog.ByFence, row.ResolvedBy)
	b.rec.waitT(t, id, "a ROLLBACK check answer", hasDecision(checkback.Rollback))
	var orders int
	require.NoError(t, b.db.Get(&orders, b.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	require.Zero(t, orders, "the black-holed transaction's business row")

	select {
	case o := <-sent:
		t.Fatalf("Send returned inside the black hole, at %s: state %s, %v", o.at, o.res.State, o.err)
	default:
	}
	t.Logf("fenced and answered ROLLBACK at %s", time.Since(started).Round(time.Millisecond))
	hole.Cut() // the partition heals: the client's connections end
	hole.Restore()
	o := <-sent
	t.Logf("Send returned at %s after the heal: state %s, %v", o.at.Round(time.Millisecond), o.res.State, o.err)
	require.Error(t, o.err)
	require.NotEqual(t, txproducer.StateCommitted, o.res.State)

	b.sendMarker(t, healthy)
	require.Zero(t, b.coll.Snapshot().Counts[id], "a copy of the rolled back event")
	again, err := p.Send(ctx, b.msg(id), insertOrder(id))
	require.NoError(t, err, "the retry with the same id")
	require.Equal(t, txproducer.StateCommitted, again.State)
	require.False(t, again.Duplicate)
	b.exactlyOneCopy(t, p, id)
}
