package checkback_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// fakeLog is an in-memory txlog for decision-rule unit tests. The real
// store's locking behaviour is covered by txlog's and txproducer's
// integration tests.
type fakeLog struct {
	mu     sync.Mutex
	rows   map[string]txlog.Row
	getErr error
	block  bool // Get waits for ctx
	fences map[string]int
}

func (f *fakeLog) fenceCalls(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fences[id]
}

func newFakeLog() *fakeLog { return &fakeLog{rows: map[string]txlog.Row{}} }

func (f *fakeLog) Get(ctx context.Context, id string) (txlog.Row, error) {
	if f.block {
		<-ctx.Done()
		return txlog.Row{}, ctx.Err()
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
	f.mu.Lock()
	if f.fences == nil {
		f.fences = map[string]int{}
	}
	f.fences[r.EventID]++
	f.mu.Unlock()
	r.State = txlog.StateRolledBack
	if r.ResolvedBy == "" {
		r.ResolvedBy = txlog.ByFence
	}
	return f.Record(ctx, r)
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

// committedRow is the row txproducer writes for a committed event, with
// the UNIQ_KEY of the half that committed it among its properties.
func committedRow(id, topic, half string, body []byte) txlog.Row {
	props := wire.Envelope{EventID: id, EventType: "T"}.Properties(body)
	if half != "" {
		props[primitive.PropertyUniqueClientMessageIdKeyIndex] = half
	}
	js, _ := json.Marshal(props)
	return txlog.Row{EventID: id, ProducerGroup: "g", Topic: topic, Tags: "tag", Keys: id, EventType: "T",
		State: txlog.StateCommitted, Payload: body, PayloadHash: wire.Hash(body), Properties: string(js), ResolvedBy: txlog.ByLocalCommit}
}

// halfMessage builds a half message as a check request carries it.
func halfMessage(group, id, half string, body []byte) *primitive.MessageExt {
	m := &primitive.MessageExt{Message: primitive.Message{Topic: "RMQ_SYS_TRANS_HALF_TOPIC", Body: body}, BornTimestamp: now.UnixMilli()}
	props := wire.Envelope{EventID: id, EventType: "T"}.Properties(body)
	for k, v := range map[string]string{"REAL_TOPIC": "orders", "TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": half, "KEYS": id} {
		props[k] = v
	}
	m.WithProperties(props)
	return m
}

// Several halves can carry one event id; the row records the UNIQ_KEY of
// the one that committed. A check of any other half answers ROLLBACK, or
// the broker would store the event a second time; the committed half and
// any half of a row that records none are answered from the row's state.
func TestOtherHalfIsRolledBack(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	log := newFakeLog()
	log.rows["e"] = committedRow("e", "orders", "winner", body)
	old := committedRow("old", "orders", "", body) // a row that records no half
	log.rows["old"] = old
	rb := committedRow("rb", "orders", "winner", body)
	rb.State = txlog.StateRolledBack
	log.rows["rb"] = rb
	c := checker(t, log, nil)
	ctx := context.Background()

	for _, tc := range []struct {
		id, half string
		want     checkback.Decision
		reason   checkback.Reason
	}{
		{"e", "winner", checkback.Commit, checkback.ReasonFound},
		{"e", "loser", checkback.Rollback, checkback.ReasonOtherHalf},
		{"e", "", checkback.Commit, checkback.ReasonFound}, // no UNIQ_KEY: never decided from an absence
		{"old", "loser", checkback.Commit, checkback.ReasonFound},
		{"rb", "winner", checkback.Rollback, checkback.ReasonFound},
		// rolled back for another half: a retry of the id may be taking it
		// over with this half, so the row does not decide it (young: UNKNOWN)
		{"rb", "loser", checkback.Unknown, checkback.ReasonYoung},
	} {
		a := c.Check(ctx, halfMessage("g", tc.id, tc.half, body))
		require.Equal(t, tc.want, a.Decision, "%s/%s", tc.id, tc.half)
		require.Equal(t, tc.reason, a.Reason, "%s/%s", tc.id, tc.half)
	}
	require.Equal(t, "winner", checkback.CommittedHalf(log.rows["e"]))
	require.Empty(t, checkback.CommittedHalf(old))
	require.Empty(t, checkback.CommittedHalf(txlog.Row{Properties: "not json"}))
	require.Equal(t, "loser", checkback.QueryFromMessage(halfMessage("g", "e", "loser", body)).HalfKey)
}

// The half property the txlog names is the client's UNIQ_KEY.
func TestHalfPropertyIsUniqKey(t *testing.T) {
	t.Parallel()
	require.Equal(t, primitive.PropertyUniqueClientMessageIdKeyIndex, txlog.HalfProperty)
	require.Equal(t, "h1", txlog.Row{Properties: txlog.HalfProperties("h1")}.Half())
}

// A row rolled back for another half does not decide this half: young, the
// check answers UNKNOWN (a Send retrying the id may be taking it over with
// this half); past the fence age it fences this half and answers what the
// row then says: ROLLBACK, or COMMIT when the retake with this half won.
// Fence rows and resolver rows name the half they decide.
func TestRolledBackForAnotherHalf(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	log := newFakeLog()
	rb := committedRow("rb", "orders", "first", body)
	rb.State = txlog.StateRolledBack
	log.rows["rb"] = rb
	c := checker(t, log, nil)
	ctx := context.Background()
	old := func(id, half string) *primitive.MessageExt {
		m := halfMessage("g", id, half, body)
		m.BornTimestamp = now.Add(-time.Minute).UnixMilli()
		return m
	}
	a := c.Check(ctx, old("rb", "second"))
	require.Equal(t, checkback.Rollback, a.Decision)
	require.Equal(t, checkback.ReasonFenced, a.Reason)
	require.Equal(t, 1, log.fenceCalls("rb"), "the half was fenced")

	won := committedRow("rb", "orders", "third", body) // the retake with "third" committed
	log.rows["rb"] = won
	require.Equal(t, checkback.Commit, c.Check(ctx, old("rb", "third")).Decision)
	require.Equal(t, checkback.Rollback, c.Check(ctx, old("rb", "first")).Decision)

	a = c.Check(ctx, old("none", "h9"))
	require.Equal(t, checkback.ReasonFenced, a.Reason)
	require.Equal(t, "h9", log.rows["none"].Half(), "a fence row names its half")
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
	log.rows["e1"] = txlog.Row{EventID: "e1", State: txlog.StateCommitted, PayloadHash: wire.Hash([]byte("x"))}
	c := checker(t, log, nil)
	m := &primitive.MessageExt{Message: primitive.Message{Topic: "t", Body: []byte("x")}, BornTimestamp: now.UnixMilli()}
	m.WithProperties(wire.Envelope{EventID: "e1", EventType: "T"}.Properties([]byte("x")))
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
}
