package checkback_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/txlog"
)

// fakeLog is an in-memory txlog for decision-rule unit tests. The real
// store's locking behaviour is covered by txlog's and txproducer's
// integration tests.
type fakeLog struct {
	mu        sync.Mutex
	rows      map[string]txlog.Row
	getErr    error
	block     bool // Get waits for ctx
	recovered map[string]txlog.RecoveryDecision
	failGets  atomic.Int64 // fail this many Gets first
	failMarks atomic.Int64 // fail this many MarkRecovered first
}

func newFakeLog() *fakeLog {
	return &fakeLog{rows: map[string]txlog.Row{}, recovered: map[string]txlog.RecoveryDecision{}}
}

func (f *fakeLog) Get(ctx context.Context, id string) (txlog.Row, error) {
	if f.block {
		<-ctx.Done()
		return txlog.Row{}, ctx.Err()
	}
	if f.failGets.Add(-1) >= 0 {
		return txlog.Row{}, errors.New("connection refused")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return txlog.Row{}, f.getErr
	}
	r, ok := f.rows[id]
	if !ok {
		return txlog.Row{}, txlog.ErrNotFound
	}
	return r, nil
}

func (f *fakeLog) Record(_ context.Context, r txlog.Row) (txlog.Row, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old, ok := f.rows[r.EventID]; ok {
		return old, false, nil
	}
	f.rows[r.EventID] = r
	return r, true, nil
}

func (f *fakeLog) Fence(ctx context.Context, r txlog.Row) (txlog.Row, bool, error) {
	r.State = txlog.StateRolledBack
	if r.ResolvedBy == "" {
		r.ResolvedBy = txlog.ByFence
	}
	return f.Record(ctx, r)
}

func (f *fakeLog) MarkRecovered(_ context.Context, id string, d txlog.RecoveryDecision, _ string) error {
	if f.failMarks.Add(-1) >= 0 {
		return errors.New("connection refused")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.rows[id]
	if !ok {
		return txlog.ErrNotFound
	}
	r.RecoveryDecision, r.RecoveredAt = d, time.Now()
	f.rows[id] = r
	f.recovered[id] = d
	return nil
}

var now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func checker(t *testing.T, log checkback.Log, mod func(*checkback.Config)) *checkback.Checker {
	t.Helper()
	cfg := checkback.Config{Log: log, Group: "g", FenceAge: 10 * time.Second, QueryTimeout: 100 * time.Millisecond,
		Now: func() time.Time { return now }}
	if mod != nil {
		mod(&cfg)
	}
	c, err := checkback.New(cfg)
	require.NoError(t, err)
	return c
}

func query(id string, age time.Duration) checkback.Query {
	return checkback.Query{EventID: id, Topic: "t", PayloadHash: "h1", BornAt: now.Add(-age)}
}

func TestDecisionRule(t *testing.T) {
	t.Parallel()
	log := newFakeLog()
	log.rows["c"] = txlog.Row{EventID: "c", State: txlog.StateCommitted, PayloadHash: "h1"}
	log.rows["r"] = txlog.Row{EventID: "r", State: txlog.StateRolledBack}
	log.rows["other"] = txlog.Row{EventID: "other", State: txlog.StateCommitted, PayloadHash: "h2"}
	c := checker(t, log, nil)
	ctx := context.Background()

	for _, tc := range []struct {
		q      checkback.Query
		want   checkback.Decision
		reason checkback.Reason
	}{
		{query("c", time.Second), checkback.Commit, checkback.ReasonFound},
		{query("r", time.Hour), checkback.Rollback, checkback.ReasonFound},
		{query("other", time.Second), checkback.Rollback, checkback.ReasonHashMismatch},
		{query("young", 9*time.Second), checkback.Unknown, checkback.ReasonYoung},
		{query("skewed", -time.Minute), checkback.Unknown, checkback.ReasonYoung},
		{checkback.Query{EventID: "noborn"}, checkback.Unknown, checkback.ReasonYoung},
		{query("old", 11*time.Second), checkback.Rollback, checkback.ReasonFenced},
		{checkback.Query{}, checkback.Unknown, checkback.ReasonNoEventID},
	} {
		a := c.CheckQuery(ctx, tc.q)
		require.Equal(t, tc.want, a.Decision, tc.q.EventID)
		require.Equal(t, tc.reason, a.Reason, tc.q.EventID)
	}
	require.Equal(t, txlog.ByFence, log.rows["old"].ResolvedBy)
	_, young := log.rows["young"]
	require.False(t, young, "a young transaction is never fenced")
	// Once fenced, every later answer is the same (I3).
	require.Equal(t, checkback.Rollback, c.CheckQuery(ctx, query("old", time.Second)).Decision)
}

func TestProbeMessagesRollBack(t *testing.T) {
	t.Parallel()
	c := checker(t, newFakeLog(), nil)
	m := &primitive.MessageExt{Message: primitive.Message{Topic: "t"}}
	m.WithProperty(checkback.PropProbe, "1")
	require.Equal(t, checkback.Rollback, c.Check(context.Background(), m).Decision)
}

func TestCheckFromMessage(t *testing.T) {
	t.Parallel()
	log := newFakeLog()
	log.rows["e1"] = txlog.Row{EventID: "e1", State: txlog.StateCommitted, PayloadHash: envelope.Hash([]byte("x"))}
	c := checker(t, log, nil)
	m := &primitive.MessageExt{Message: primitive.Message{Topic: "t", Body: []byte("x")}, BornTimestamp: now.UnixMilli()}
	m.WithProperties(envelope.Envelope{EventID: "e1", EventType: "T"}.Properties([]byte("x")))
	a := c.Check(context.Background(), m)
	require.Equal(t, checkback.Commit, a.Decision)
	require.Equal(t, primitive.CommitMessageState, a.Decision.LocalTransactionState())
}

func TestErrorsAndTimeoutsAnswerUnknown(t *testing.T) {
	t.Parallel()
	log := newFakeLog()
	log.getErr = errors.New("connection refused")
	c := checker(t, log, nil)
	a := c.CheckQuery(context.Background(), query("x", time.Hour))
	require.Equal(t, checkback.Unknown, a.Decision)
	require.Equal(t, checkback.ReasonError, a.Reason)
	require.Error(t, a.Err)

	slow := newFakeLog()
	slow.block = true
	c = checker(t, slow, func(cfg *checkback.Config) { cfg.Now = time.Now })
	start := time.Now()
	a = c.CheckQuery(context.Background(), query("x", time.Hour))
	require.Equal(t, checkback.ReasonError, a.Reason)
	require.ErrorIs(t, a.Err, context.DeadlineExceeded, "the query timeout bounds the check")
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestResolver(t *testing.T) {
	t.Parallel()
	log := newFakeLog()
	var answers []checkback.Answer
	c := checker(t, log, func(cfg *checkback.Config) {
		cfg.Resolver = checkback.ResolverFunc(func(_ context.Context, q checkback.Query) (checkback.Decision, error) {
			switch q.EventID {
			case "paid":
				return checkback.Commit, nil
			case "boom":
				panic("resolver bug")
			case "err":
				return checkback.Unknown, errors.New("business db down")
			}
			return checkback.Unknown, nil
		})
		cfg.OnAnswer = func(a checkback.Answer) { answers = append(answers, a) }
	})
	ctx := context.Background()
	a := c.CheckQuery(ctx, query("paid", time.Second))
	require.Equal(t, checkback.Commit, a.Decision)
	require.Equal(t, checkback.ReasonResolver, a.Reason)
	require.Equal(t, txlog.ByResolver, log.rows["paid"].ResolvedBy, "the resolver's decision is persisted")

	a = c.CheckQuery(ctx, query("boom", time.Hour))
	require.Equal(t, checkback.Unknown, a.Decision)
	require.Equal(t, checkback.ReasonPanic, a.Reason)
	a = c.CheckQuery(ctx, query("err", time.Hour))
	require.Equal(t, checkback.ReasonError, a.Reason)
	a = c.CheckQuery(ctx, query("undecided", time.Hour))
	require.Equal(t, checkback.ReasonFenced, a.Reason, "an undecided resolver falls back to the fence-age rule")
	require.Len(t, answers, 4)
}

func TestConfigRequired(t *testing.T) {
	t.Parallel()
	_, err := checkback.New(checkback.Config{Group: "g"})
	require.ErrorIs(t, err, checkback.ErrConfig)
	_, err = checkback.New(checkback.Config{Log: newFakeLog()})
	require.ErrorIs(t, err, checkback.ErrConfig)
	_, err = checkback.NewRecovery(checkback.RecoveryConfig{Group: "g", Log: newFakeLog()})
	require.ErrorIs(t, err, checkback.ErrConfig)
}
