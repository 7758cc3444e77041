package txproducer_test

import (
	"context"
	"fmt"
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

// The one outcome Send cannot know, produced for real on each database: the
// local transaction's COMMIT reaches the server and commits, and the answer
// is lost. A protocol-aware proxy between the producer and the server
// (testenv.NewMySQLProxy, testenv.NewPGProxy) forwards the COMMIT, reads
// the server's answer (OK; CommandComplete "COMMIT") and drops it, and cuts every connection
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
	eachDB(t, 1, testCommitAnswerLostRetrySameID)
}

// commitLoser is the proxy of either database, for one test body: lose arms
// it and returns a wait for the answer it dropped (whether the server
// committed, and how it answered).
type commitLoser struct {
	addr    string
	restore func()
	lose    func(t *testing.T) func() (ok, lost bool, answer string)
}

func newCommitLoser(t *testing.T, b *bundle) commitLoser {
	if b.db.DriverName() != "mysql" {
		px := testenv.NewPGProxy(t, testenv.ServerAddr(t, b.db))
		return commitLoser{addr: px.Addr(), restore: px.Restore, lose: func(t *testing.T) func() (bool, bool, string) {
			ch := px.LoseCommitAnswer(t)
			return func() (bool, bool, string) {
				select {
				case l := <-ch:
					return l.OK(), true, "tag " + l.Tag
				default:
					return false, false, ""
				}
			}
		}}
	}
	px := testenv.NewMySQLProxy(t, testenv.ServerAddr(t, b.db))
	return commitLoser{addr: px.Addr(), restore: px.Restore, lose: func(t *testing.T) func() (bool, bool, string) {
		ch := px.LoseCommitAnswer(t)
		return func() (bool, bool, string) {
			select {
			case l := <-ch:
				return l.OK(), true, fmt.Sprintf("first byte %#x", l.Answer[0])
			default:
				return false, false, ""
			}
		}
	}}
}

func testCommitAnswerLostRetrySameID(t *testing.T, b *bundle) {
	proxy := newCommitLoser(t, b)
	cfg := b.config()
	cfg.DB = testenv.PoolVia(t, b.db, proxy.addr)
	cfg.CheckTimeout = 2 * time.Second // bounds the read-back that the cut makes fail
	p := startProducer(t, cfg)
	ctx := context.Background()
	id := "lost-" + testenv.RandSuffix(8)
	var runs atomic.Int32
	var lost func() (ok, lost bool, answer string)
	fn := func(ctx context.Context, tx *sqlx.Tx) error {
		if err := countingOrder(id, &runs)(ctx, tx); err != nil {
			return err
		}
		// Armed inside the local transaction: the next COMMIT through the
		// proxy is this one.
		lost = proxy.lose(t)
		return nil
	}

	res, err := p.Send(ctx, b.msg(id), fn)
	require.ErrorIs(t, err, txproducer.ErrCommitUnknown)
	require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err))
	require.Equal(t, txproducer.StateUnknown, res.State)
	require.Equal(t, id, res.EventID)
	require.NotNil(t, lost, "the local transaction ran")
	ok, dropped, answer := lost()
	require.True(t, dropped, "the proxy lost no COMMIT answer")
	require.True(t, ok, "the server answered the COMMIT as committed (%s); the client never got it", answer)
	// Read directly, not through the proxy: the COMMIT did commit.
	row := b.row(t, id)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Equal(t, txlog.ByLocalCommit, row.ResolvedBy)

	proxy.restore()
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
