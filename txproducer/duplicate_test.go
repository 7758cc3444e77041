package txproducer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// countingOrder is insertOrder(id) that counts its runs.
func countingOrder(id string, runs *atomic.Int32) txproducer.LocalTxFunc {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		runs.Add(1)
		return insertOrder(id)(ctx, tx)
	}
}

// exactlyOneCopy waits for id on the topic, then for a marker sent after
// it (one queue: everything before the marker has been delivered), and
// asserts the consumer saw id once.
func (b *bundle) exactlyOneCopy(t *testing.T, p *txproducer.Producer, id string) {
	t.Helper()
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "event %s not consumed", id)
	b.sendMarker(t, p)
	require.Equal(t, 1, b.coll.Snapshot().Counts[id], "copies of %s on the topic", id)
	var orders int
	require.NoError(t, b.db.Get(&orders, b.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	require.Equal(t, 1, orders, "business rows of %s", id)
}

// A retry of a committed event id, one Send after the other: the second's
// local transaction finds the row at its first statement, so it is answered
// from the txlog (Duplicate, committed, no error) without running the
// function, and its half is rolled back; one copy on the topic. The same id
// with another payload is a conflict.
func TestSendSameIDSequential(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testSendSameIDSequential)
}

func testSendSameIDSequential(t *testing.T, b *bundle) {
	p := startProducer(t, b.config())
	ctx := context.Background()
	id := "seq-" + testenv.RandSuffix(8)
	var runs atomic.Int32

	first, err := p.Send(ctx, b.msg(id), countingOrder(id, &runs))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, first.State)
	require.False(t, first.Duplicate)

	again, err := p.Send(ctx, b.msg(id), countingOrder(id, &runs))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, again.State)
	require.True(t, again.Duplicate)
	require.Equal(t, id, again.EventID)
	require.NotEqual(t, first.MsgID, again.MsgID, "the retry sent its own half (no lookup first); it was rolled back")
	require.EqualValues(t, 1, runs.Load(), "the function ran once")

	other := b.msg(id)
	other.Payload = []byte(`{"order":"something else"}`)
	res, err := p.Send(ctx, other, countingOrder(id, &runs))
	require.ErrorIs(t, err, txproducer.ErrEventIDConflict)
	require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(err))
	require.Equal(t, txproducer.StateRolledBack, res.State)
	require.EqualValues(t, 1, runs.Load())

	b.exactlyOneCopy(t, p, id)
}

// Two Sends of one id race: both pass the txlog lookup and send a half
// message (the hook holds the first local transaction until the second
// one has started); the second waits on the first's row lock, finds the
// row, answers ROLLBACK for its own half and reports the event committed.
// One copy on the topic, the function ran once.
func TestSendSameIDConcurrent(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testSendSameIDConcurrent)
}

func testSendSameIDConcurrent(t *testing.T, b *bundle) {
	id := "race-" + testenv.RandSuffix(8)
	var entered atomic.Int32
	bothIn := make(chan struct{})
	cfg := b.config()
	cfg.Test.BeforeLocalTx = func(_ context.Context, eventID string) {
		if eventID == id && entered.Add(1) == 2 {
			close(bothIn)
		}
	}
	p := startProducer(t, cfg)
	var runs atomic.Int32
	fn := func(ctx context.Context, tx *sqlx.Tx) error {
		if err := countingOrder(id, &runs)(ctx, tx); err != nil {
			return err
		}
		select {
		case <-bothIn:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}

	results := make([]txproducer.Result, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = p.Send(context.Background(), b.msg(id), fn)
		}()
	}
	wg.Wait()
	dups := 0
	for i, r := range results {
		require.NoError(t, errs[i])
		require.Equal(t, txproducer.StateCommitted, r.State)
		require.NotEmpty(t, r.MsgID, "both Sends sent a half message")
		if r.Duplicate {
			dups++
		}
	}
	require.Equal(t, 1, dups, "one Send committed, the other found it committed: %+v", results)
	require.EqualValues(t, 1, runs.Load(), "the function ran once")
	require.NotEqual(t, results[0].MsgID, results[1].MsgID)
	b.exactlyOneCopy(t, p, id)
}

// Many Sends of one id at once, with no hook: whichever path each takes
// (txlog lookup, row lock, duplicate key), one commits, the others report
// Duplicate, and one copy reaches the topic.
func TestSendSameIDStorm(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testSendSameIDStorm)
}

func testSendSameIDStorm(t *testing.T, b *bundle) {
	const senders = 8
	cfg := b.config()
	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	cfg.Metrics = m
	p := startProducer(t, cfg)
	id := "storm-" + testenv.RandSuffix(8)
	var runs atomic.Int32
	var dups, committed atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < senders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res, err := p.Send(context.Background(), b.msg(id), countingOrder(id, &runs))
			if err != nil || res.State != txproducer.StateCommitted {
				t.Errorf("send: %v (%s)", err, res.State)
				return
			}
			committed.Add(1)
			if res.Duplicate {
				dups.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, senders, committed.Load())
	require.EqualValues(t, senders-1, dups.Load())
	require.EqualValues(t, 1, runs.Load(), "the function ran once")
	require.Equal(t, txlog.ByLocalCommit, b.row(t, id).ResolvedBy)
	sends := func(result string) float64 {
		return testutil.ToFloat64(m.ProducerSends.WithLabelValues(b.group, "OrderPlaced", result))
	}
	require.EqualValues(t, 1, sends("committed"))
	require.EqualValues(t, senders-1, sends("duplicate"))
	b.exactlyOneCopy(t, p, id)
}
