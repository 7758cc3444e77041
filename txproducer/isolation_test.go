package txproducer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// barrier lets n functions wait for each other, bounded by their context.
type barrier struct {
	mu   sync.Mutex
	left int
	all  chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{left: n, all: make(chan struct{})} }

func (b *barrier) wait(ctx context.Context) error {
	b.mu.Lock()
	if b.left--; b.left == 0 {
		close(b.all)
	}
	b.mu.Unlock()
	select {
	case <-b.all:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("barrier: %w", ctx.Err())
	}
}

// sqlState returns err's SQLSTATE (PostgreSQL), or "".
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// A caller's local transaction that the database rolls back to keep two
// concurrent SERIALIZABLE transactions serializable (the producer's pool
// defaults to SERIALIZABLE, a session setting of its DSN). Two Sends read
// rows, wait until both have read, then write:
//
//   - "same row": both update the row both read. PostgreSQL lets the first
//     updater win and fails the other's UPDATE with a serialization failure
//     (40001); MariaDB's SERIALIZABLE reads took shared locks, so the two
//     updates deadlock and one is chosen as the victim. Either way the
//     loser's function gets the error, and Send returns it wrapped in
//     ErrLocalTx.
//   - "write skew": each updates the row the other read. PostgreSQL fails
//     one of them at its UPDATE or at its COMMIT (then Send's error wraps
//     ErrDatabase); MariaDB deadlocks as above.
//
// The loser's error is retryable with a new event id (RetryAdvice), and
// nothing of it is committed: its txlog row records the local rollback, its
// write is not in the table, and no copy of its event is on the topic,
// counted after a marker. The retry with a new id commits, and one copy of
// it arrives.
func TestSerializationFailureIsRetryableWithNewID(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		for _, skew := range []bool{false, true} {
			name := "same row"
			if skew {
				name = "write skew"
			}
			t.Run(name, func(t *testing.T) { testSerializationFailure(t, b, skew) })
		}
	})
}

func testSerializationFailure(t *testing.T, b *bundle, skew bool) {
	ctx := context.Background()
	accounts := "accounts_" + testenv.RandSuffix(6)
	_, err := b.db.Exec("CREATE TABLE " + accounts + " (id VARCHAR(16) NOT NULL PRIMARY KEY, balance INT NOT NULL)")
	require.NoError(t, err)
	_, err = b.db.Exec("INSERT INTO " + accounts + " (id, balance) VALUES ('x', 100), ('y', 100)")
	require.NoError(t, err)
	cfg := b.config()
	cfg.DB = testenv.SessionIsolationDB(t, b.db, testenv.Serializable)
	cfg.LocalTxTimeout = 30 * time.Second
	p := startProducer(t, cfg)

	both := newBarrier(2)
	// spend reads account read and, once both functions have read, takes
	// one from account write (the same one for "same row").
	spend := func(read, write string, synced bool) txproducer.LocalTxFunc {
		return func(ctx context.Context, tx *sqlx.Tx) error {
			var balance int
			if err := tx.GetContext(ctx, &balance, tx.Rebind("SELECT balance FROM "+accounts+" WHERE id = ?"), read); err != nil {
				return err
			}
			if synced {
				if err := both.wait(ctx); err != nil {
					return err
				}
			}
			_, err := tx.ExecContext(ctx, tx.Rebind("UPDATE "+accounts+" SET balance = balance - 1 WHERE id = ?"), write)
			return err
		}
	}
	type sent struct {
		id  string
		res txproducer.Result
		err error
	}
	ids := []string{"ser-a-" + testenv.RandSuffix(6), "ser-b-" + testenv.RandSuffix(6)}
	fns := []txproducer.LocalTxFunc{spend("x", "x", true), spend("x", "x", true)}
	if skew {
		fns = []txproducer.LocalTxFunc{spend("x", "y", true), spend("y", "x", true)}
	}
	out := make(chan sent, 2)
	for i, id := range ids {
		go func() {
			res, err := p.Send(ctx, b.msg(id), fns[i])
			out <- sent{id, res, err}
		}()
	}
	var won, lost []sent
	for range ids {
		s := <-out
		if s.err == nil {
			won = append(won, s)
		} else {
			lost = append(lost, s)
		}
	}
	require.Len(t, won, 1, "one transaction commits: won %+v, lost %+v", won, lost)
	require.Len(t, lost, 1, "the database rolls the other back")
	w, l := won[0], lost[0]
	require.Equal(t, txproducer.StateCommitted, w.res.State)
	require.Equal(t, txproducer.StateRolledBack, l.res.State)
	if !skew || !errors.Is(l.err, txproducer.ErrDatabase) {
		require.ErrorIs(t, l.err, txproducer.ErrLocalTx, "the function got the database's error: %v", l.err)
	}
	require.True(t, dialect.RolledBack(l.err), "a deadlock or serialization failure: %v", l.err)
	if b.db.DriverName() != "mysql" {
		require.Equal(t, "40001", sqlState(l.err), "a serialization failure: %v", l.err)
	}
	require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(l.err), "%v", l.err)
	require.True(t, txproducer.IsRetryable(l.err), "%v", l.err)
	row := b.row(t, l.id)
	require.Equal(t, txlog.StateRolledBack, row.State, "nothing of the loser is committed")
	require.Equal(t, txlog.ByLocalRollback, row.ResolvedBy)
	require.Equal(t, txlog.StateCommitted, b.row(t, w.id).State)
	var total int
	require.NoError(t, b.db.Get(&total, "SELECT SUM(balance) FROM "+accounts))
	require.Equal(t, 199, total, "the winner's write alone")

	// The retry, with a new id (the loser's is spent), runs the function
	// again and commits.
	retry := b.msg("")
	res, err := p.Send(ctx, retry, spend("x", "x", false))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.NotEqual(t, l.id, res.EventID)
	require.NoError(t, b.db.Get(&total, "SELECT SUM(balance) FROM "+accounts))
	require.Equal(t, 198, total)

	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool {
		return s.Counts[w.id] > 0 && s.Counts[res.EventID] > 0
	}), "the committed events arrive")
	b.sendMarker(t, p)
	snap := b.coll.Snapshot()
	require.Zero(t, snap.Counts[l.id], "no copy of the rolled-back event")
	require.Equal(t, 1, snap.Counts[w.id])
	require.Equal(t, 1, snap.Counts[res.EventID], "one copy of the retry")
	t.Logf("%s: loser %s rolled back by the database (%v); retried as %s, committed", b.db.DriverName(), l.id, l.err, res.EventID)
}

// A statement that fails inside the caller's function, whose error the
// function ignores: MariaDB rolls back that statement only and the local
// transaction commits the rest; PostgreSQL aborts the whole transaction, so
// its COMMIT rolls back, and Send reports a rollback with a retryable
// error (ErrDatabase) when the function returned nil. Either way the txlog and the topic agree with the
// business table: committed and delivered once, or nothing anywhere.
func TestFailedStatementIgnoredByTheFunction(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testFailedStatementIgnoredByTheFunction)
}

func testFailedStatementIgnoredByTheFunction(t *testing.T, b *bundle) {
	ctx := context.Background()
	p := startProducer(t, b.config())
	taken := "taken-" + testenv.RandSuffix(6)
	_, err := b.db.Exec(b.db.Rebind("INSERT INTO orders (id, amount) VALUES (?, 1)"), taken)
	require.NoError(t, err)
	id := "ignored-" + testenv.RandSuffix(6)
	var stmtErr error
	res, err := p.Send(ctx, b.msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
		_, stmtErr = tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (id, amount) VALUES (?, 1)"), taken)
		return insertOrder(id)(ctx, tx) // on PostgreSQL this fails too: the transaction is aborted
	})
	require.True(t, txlog.IsDuplicateKey(stmtErr), "precondition: the first statement fails: %v", stmtErr)
	var orders int
	if b.db.DriverName() == "mysql" {
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		b.exactlyOneCopy(t, p, id)
		return
	}
	// PostgreSQL: the function's second statement already failed
	// ("current transaction is aborted"), so it returned that error: the
	// caller's function failed, which sending again unchanged cannot mend
	// (IsRetryable); a retry after a fix takes the same id (RetryAdvice).
	require.ErrorIs(t, err, txproducer.ErrLocalTx)
	require.Equal(t, "25P02", sqlState(err), "in failed SQL transaction: %v", err)
	require.Equal(t, txproducer.StateRolledBack, res.State)
	require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err), "%v", err)
	require.False(t, txproducer.IsRetryable(err), "%v", err)
	require.Equal(t, txlog.StateRolledBack, b.row(t, id).State)
	require.NoError(t, b.db.Get(&orders, b.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	require.Zero(t, orders)

	// A function that ignores every error: its COMMIT is the rollback.
	quiet := "quiet-" + testenv.RandSuffix(6)
	res, err = p.Send(ctx, b.msg(quiet), func(ctx context.Context, tx *sqlx.Tx) error {
		_, _ = tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (id, amount) VALUES (?, 1)"), taken)
		_ = insertOrder(quiet)(ctx, tx)
		return nil
	})
	require.ErrorIs(t, err, txproducer.ErrDatabase)
	require.Equal(t, txproducer.StateRolledBack, res.State)
	require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err))
	require.Equal(t, txlog.StateRolledBack, b.row(t, quiet).State)
	b.sendMarker(t, p)
	snap := b.coll.Snapshot()
	require.Zero(t, snap.Counts[id])
	require.Zero(t, snap.Counts[quiet])
	require.NoError(t, b.db.Get(&orders, b.db.Rebind("SELECT COUNT(*) FROM orders WHERE id IN (?, ?)"), id, quiet))
	require.Zero(t, orders)
	t.Logf("postgres: a failed statement aborts the local transaction: %v", err)
}
