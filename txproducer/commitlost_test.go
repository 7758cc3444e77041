package txproducer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The one outcome Send cannot know, produced for real: the local
// transaction's COMMIT reaches MariaDB and commits, and the answer is lost.
// A MySQL-aware proxy between the producer and MariaDB forwards the COMMIT
// packet, reads the server's OK and drops it, and cuts every connection
// through it, so the producer's read-back of the outcome fails too. Send
// returns ErrCommitUnknown (RetryWithSameID) with State Unknown. The retry
// with the same id, once the database is reachable, learns the outcome from
// the txlog: committed, Duplicate, no half message, the function not run
// again. The half of the first Send is resolved by the real broker's check
// from the txlog: COMMIT. One copy on the topic (counted by an independent
// consumer after a marker, so a late copy would be counted) and one
// business row.
func TestCommitAnswerLostRetrySameID(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	proxy := testenv.NewMySQLProxy(t, b.s.MySQLAddr)
	cfg := b.config()
	cfg.DB = testenv.DBVia(t, b.db, proxy.Addr())
	cfg.CheckTimeout = 2 * time.Second // bounds the read-back that the cut makes fail
	p := startProducer(t, cfg)
	ctx := context.Background()
	id := "lost-" + testenv.RandSuffix(8)
	var runs atomic.Int32
	var lost <-chan testenv.LostCommit
	fn := func(ctx context.Context, tx *sqlx.Tx) error {
		if err := countingOrder(id, &runs)(ctx, tx); err != nil {
			return err
		}
		// Armed inside the local transaction: the next COMMIT through the
		// proxy is this one.
		lost = proxy.LoseCommitAnswer(t)
		return nil
	}

	res, err := p.Send(ctx, b.msg(id), fn)
	require.ErrorIs(t, err, txproducer.ErrCommitUnknown)
	require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err))
	require.Equal(t, txproducer.StateUnknown, res.State)
	require.Equal(t, id, res.EventID)
	require.NotNil(t, lost, "the local transaction ran")
	select {
	case l := <-lost:
		require.True(t, l.OK(), "the server answered the COMMIT with OK (first byte %#x); the client never got it", l.Answer[0])
	default:
		t.Fatal("the proxy lost no COMMIT answer")
	}
	// Read directly, not through the proxy: the COMMIT did commit.
	row := b.row(t, id)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Equal(t, txlog.ByLocalCommit, row.ResolvedBy)

	proxy.Restore()
	again, err := p.Send(ctx, b.msg(id), countingOrder(id, &runs))
	require.NoError(t, err, "the retry with the same id learns the outcome")
	require.Equal(t, txproducer.StateCommitted, again.State)
	require.True(t, again.Duplicate)
	require.Equal(t, id, again.EventID)
	// The retry's own half is rolled back (insert-first found the row);
	// exactlyOneCopy below proves no second copy reached the topic.
	require.EqualValues(t, 1, runs.Load(), "the function ran once")

	// The first half was answered UNKNOWN; the broker's check resolves it
	// from the txlog.
	b.rec.waitT(t, id, "a COMMIT check answer for the first half", hasDecision(checkback.Commit))
	b.exactlyOneCopy(t, p, id)
}
