package checkback_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// skewFenceAge is the checkers' FenceAge: it fits the test broker
// (transactionTimeOut 3 s, interval 2 s), and a 30 s skew is far beyond it.
const skewFenceAge = 4 * time.Second

// TestCheckSkew: the instance that answers the checks has a clock 30 s
// ahead of, then 30 s behind, the clock that stamped the half messages'
// born time (the sending instance's). Only that difference enters a check
// (age = checker's now - born), so "a half born on a skewed clock checked
// by an honest checker" is the same case with the sign flipped; both signs
// run. The skew goes in through checkback.Config.Now (libfaketime does not
// reach a Go binary, whose runtime reads the clock through the vDSO). The
// real broker sends the checks (every END is lost: the sender answers
// UNKNOWN), the real txlog decides, and an independent collector counts
// what arrived, settled by a marker on the one-queue topic.
//
// Expected, for d = checker - born:
//   - a COMMITTED row: COMMIT, whatever d (the row decides; no clock);
//   - a ROLLED_BACK row: ROLLBACK, whatever d;
//   - no row, d = +30 s: the half looks FenceAge old at its first check:
//     fenced and ROLLBACK (early, but the database arbitrates the fence);
//   - no row, d = -30 s: the half looks young at every check: UNKNOWN,
//     never fenced by a check (the broker would discard it and discard
//     recovery would fence it); never COMMIT;
//   - d = +30 s, a local transaction that holds its row while the early
//     fence comes: the fence meets the row (it waits on its lock) and the
//     check answers COMMIT once the transaction commits: one copy;
//   - d = +30 s, a local transaction that writes its row only after the
//     early fence: its INSERT fails on the fence's row (txlog.ErrDuplicate),
//     it rolls back, and the event never arrives.
//
// The checker's fence rows get resolved_at from the store's (honest)
// clock here, not from the skewed one; no decision of these cases reads
// resolved_at (only txlog.Store.Retake does, see TestRetakeSkew).
func TestCheckSkew(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		store, err := txlog.New(db, txlog.DefaultPrefix)
		require.NoError(t, err)
		require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
		for _, d := range []time.Duration{30 * time.Second, -30 * time.Second} {
			t.Run("checker "+d.String(), func(t *testing.T) { checkSkew(t, db, store, d) })
		}
	})
}

type skewCase int

const (
	caseCommitted  skewCase = iota // a COMMITTED row
	caseRolledBack                 // a ROLLED_BACK row
	caseNoRow                      // the local transaction never ran
	caseInFlight                   // the row is held by a transaction until a fence comes
	caseLateRow                    // the row is written only after the checker decided
)

// fenceSignalLog is the real store with a signal when a check fences.
type fenceSignalLog struct {
	*txlog.Store
	mu     sync.Mutex
	fences map[string]chan struct{}
}

func (l *fenceSignalLog) fenced(id string) chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.fences[id]
	if !ok {
		ch = make(chan struct{})
		l.fences[id] = ch
	}
	return ch
}

func (l *fenceSignalLog) Fence(ctx context.Context, r txlog.Row) (txlog.Row, bool, error) {
	ch := l.fenced(r.EventID)
	select {
	case <-ch:
	default:
		close(ch)
	}
	return l.Store.Fence(ctx, r)
}

// skewListener runs each half's local action, answers UNKNOWN to the send
// (the END is lost) and lets the skewed checker answer every check.
type skewListener struct {
	checker *checkback.Checker
	mu      sync.Mutex
	actions map[string]func()
}

func (l *skewListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	l.mu.Lock()
	act := l.actions[m.GetProperty(wire.PropEventID)]
	l.mu.Unlock()
	if act != nil {
		act()
	}
	return primitive.UnkonwnState
}

func (l *skewListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	return l.checker.Check(context.Background(), m).Decision.LocalTransactionState()
}

type answers struct {
	mu sync.Mutex
	m  map[string][]checkback.Answer
}

func (a *answers) add(x checkback.Answer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.m[x.EventID] = append(a.m[x.EventID], x)
}

func (a *answers) get(id string) []checkback.Answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]checkback.Answer(nil), a.m[id]...)
}

func (a *answers) wait(t *testing.T, id, what string, cond func([]checkback.Answer) bool) []checkback.Answer {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, what, func() bool { return cond(a.get(id)) })
	return a.get(id)
}

func checkSkew(t *testing.T, db *sqlx.DB, store *txlog.Store, d time.Duration) {
	s := testenv.Integration(t)
	group, topic := testenv.Name(t, "txg"), testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	coll := testenv.Collect(t, topic)
	ans := &answers{m: map[string][]checkback.Answer{}}
	log := &fenceSignalLog{Store: store, fences: map[string]chan struct{}{}}
	checker, err := checkback.New(checkback.Config{Log: log, Group: group, FenceAge: skewFenceAge,
		QueryTimeout: 10 * time.Second, OnAnswer: ans.add,
		Now: func() time.Time { return time.Now().Add(d) }})
	require.NoError(t, err)
	l := &skewListener{checker: checker, actions: map[string]func(){}}
	tp, err := rocketmq.NewTransactionProducer(l, producer.WithNsResolver(s.NameServerResolver()),
		producer.WithGroupName(group), producer.WithInstanceName(group), producer.WithRetry(2))
	require.NoError(t, err)
	require.NoError(t, tp.Start())
	t.Cleanup(func() { _ = tp.Shutdown() })

	var wg sync.WaitGroup
	defer wg.Wait()
	rowOf := func(id string, props map[string]string, body []byte, st txlog.State) txlog.Row {
		js, err := json.Marshal(props)
		require.NoError(t, err)
		r := txlog.Row{EventID: id, ProducerGroup: group, Topic: topic, EventType: "OrderPlaced", State: st,
			Payload: body, PayloadHash: props[wire.PropPayloadHash], Properties: string(js), ResolvedBy: txlog.ByLocalCommit}
		if st == txlog.StateRolledBack {
			r.Payload, r.ResolvedBy = nil, txlog.ByLocalRollback
		}
		return r
	}
	insert := func(r txlog.Row) (*sqlx.Tx, error) {
		tx, err := db.BeginTxx(context.Background(), nil)
		if err != nil {
			return nil, err
		}
		if err := store.Insert(context.Background(), tx, r); err != nil {
			_ = tx.Rollback()
			return nil, err
		}
		return tx, nil
	}
	errs := make(chan error, 8)
	send := func(c skewCase) (string, []byte, map[string]string) {
		id := wire.NewEventID()
		body := []byte(`{"order":"` + id + `"}`)
		props := wire.Envelope{EventID: id, EventType: "OrderPlaced"}.Properties(body)
		l.mu.Lock()
		defer l.mu.Unlock()
		switch c {
		case caseCommitted, caseRolledBack:
			st := txlog.StateCommitted
			if c == caseRolledBack {
				st = txlog.StateRolledBack
			}
			l.actions[id] = func() {
				tx, err := insert(rowOf(id, props, body, st))
				if err == nil {
					err = tx.Commit()
				}
				if err != nil {
					errs <- err
				}
			}
		case caseInFlight:
			// The row is written and held; the transaction commits only
			// once a check has begun to fence the half (the check waits
			// on the row's lock meanwhile).
			l.actions[id] = func() {
				tx, err := insert(rowOf(id, props, body, txlog.StateCommitted))
				if err != nil {
					errs <- err
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					select {
					case <-log.fenced(id):
						if err := tx.Commit(); err != nil {
							errs <- err
						}
					case <-time.After(60 * time.Second):
						_ = tx.Rollback()
						errs <- errors.New("no check fenced the in-flight half")
					}
				}()
			}
		}
		l.mu.Unlock()
		defer l.mu.Lock()
		m := primitive.NewMessage(topic, body)
		m.WithProperties(props)
		m.WithKeys([]string{id})
		res, err := tp.SendMessageInTransaction(context.Background(), m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
		return id, body, props
	}
	committed, _, _ := send(caseCommitted)
	rolledBack, _, _ := send(caseRolledBack)
	noRow, _, _ := send(caseNoRow)
	var inFlight, lateRow string
	var lateBody []byte
	var lateProps map[string]string
	if d > 0 {
		inFlight, _, _ = send(caseInFlight)
		lateRow, lateBody, lateProps = send(caseLateRow)
	}

	is := func(dec checkback.Decision) func([]checkback.Answer) bool {
		return func(as []checkback.Answer) bool { return len(as) > 0 && as[len(as)-1].Decision == dec }
	}
	a := ans.wait(t, committed, "the committed half is answered", is(checkback.Commit))
	require.Equal(t, checkback.ReasonFound, a[len(a)-1].Reason)
	a = ans.wait(t, rolledBack, "the rolled-back half is answered", is(checkback.Rollback))
	require.Equal(t, checkback.ReasonFound, a[len(a)-1].Reason)
	if d > 0 {
		a = ans.wait(t, noRow, "the half with no row is fenced early", is(checkback.Rollback))
		require.Len(t, a, 1, "fenced at its first check: it looked %s old", a[0].Age)
		require.Equal(t, checkback.ReasonFenced, a[0].Reason)
		t.Logf("no row: fenced at the first check, apparent age %s (real age %s)", a[0].Age, a[0].Age-d)
		row, err := store.Get(context.Background(), noRow)
		require.NoError(t, err)
		require.Equal(t, txlog.StateRolledBack, row.State)
		require.Equal(t, txlog.ByFence, row.ResolvedBy)

		a = ans.wait(t, inFlight, "the in-flight half is answered", is(checkback.Commit))
		require.Equal(t, checkback.ReasonFenced, a[len(a)-1].Reason, "decided by the fence, which met the committed row")

		a = ans.wait(t, lateRow, "the late half is fenced", is(checkback.Rollback))
		require.Equal(t, checkback.ReasonFenced, a[len(a)-1].Reason)
		_, err = insert(rowOf(lateRow, lateProps, lateBody, txlog.StateCommitted))
		require.ErrorIs(t, err, txlog.ErrDuplicate, "a local transaction that comes after the fence loses")
	} else {
		a = ans.wait(t, noRow, "the half with no row is checked twice", func(as []checkback.Answer) bool { return len(as) >= 2 })
		for _, x := range a {
			require.Equal(t, checkback.Unknown, x.Decision, "a half that looks young is never decided by a check")
			require.Equal(t, checkback.ReasonYoung, x.Reason)
		}
		t.Logf("no row: %d checks answered young, last apparent age %s", len(a), a[len(a)-1].Age)
		_, err := store.Get(context.Background(), noRow)
		require.ErrorIs(t, err, txlog.ErrNotFound, "no check fenced it")
	}
	select {
	case err := <-errs:
		t.Fatalf("local action: %v", err)
	default:
	}

	// Settle: a marker committed through a check after every answer above;
	// on the one-queue topic everything committed before it arrived first.
	marker, _, _ := send(caseCommitted)
	ans.wait(t, marker, "the marker is answered", is(checkback.Commit))
	require.True(t, coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[marker] > 0 }), "marker not consumed")
	snap, stored := coll.Snapshot(), coll.Stored()
	// A committed event arrives, and every copy the broker stored of it is
	// the commit of a COMMIT answer: the broker checks a half again when the
	// previous answer's END has not been processed by its next scan, and a
	// second COMMIT stores a second copy (the consumers' dedup absorbs it;
	// the fault suites count such copies). What this test holds the checker
	// to is that every answer comes from the row, so never a copy without a
	// COMMIT.
	committedOnce := func(id, what string) {
		t.Helper()
		commits := 0
		for _, x := range ans.get(id) {
			if x.Decision == checkback.Commit {
				commits++
			}
		}
		t.Logf("%s: %d COMMIT answers, %d stored copies, %d deliveries", what, commits, stored[id], snap.Counts[id])
		require.Positive(t, snap.Counts[id], "%s arrived", what)
		require.LessOrEqual(t, stored[id], commits, "%s: a stored copy per COMMIT answer at most", what)
	}
	committedOnce(committed, "the committed event")
	require.Zero(t, snap.Counts[rolledBack], "a rollback never arrives")
	require.Zero(t, snap.Counts[noRow], "a half with no row never arrives")
	if d > 0 {
		committedOnce(inFlight, "the in-flight event")
		require.Zero(t, snap.Counts[lateRow], "the fenced late event never arrives")
	}
}

// TestRetakeSkew: the one decision that compares a time written by one
// instance with a time taken on another is txlog.Store.Retake (a Send
// retrying an event id whose row records a rollback for another half may
// take the id over only if the row was resolved before the Send began).
// The fence of that Send's half writes resolved_at on the fencing
// instance's clock, and fences only once the half is FenceAge old on that
// same clock, so resolved_at >= born + FenceAge on the sender's clock >
// startedAt whatever the skew. Here the sender's clock is 30 s ahead of,
// then behind, the checker's (the checker and its store share the process
// clock, as in production); in both cases a half answered ROLLBACK is
// never taken over afterwards, and a half not yet fenced may be.
func TestRetakeSkew(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		store, err := txlog.New(db, txlog.DefaultPrefix)
		require.NoError(t, err)
		require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
		checker, err := checkback.New(checkback.Config{Log: store, Group: "g", FenceAge: skewFenceAge, QueryTimeout: 10 * time.Second})
		require.NoError(t, err)
		ctx := context.Background()
		for _, s := range []time.Duration{30 * time.Second, -30 * time.Second} {
			t.Run("sender "+s.String(), func(t *testing.T) {
				id := wire.NewEventID()
				// An earlier Send's half of the id was rolled back an hour ago.
				old := time.Now().Add(-time.Hour)
				_, _, err := store.Record(ctx, txlog.Row{EventID: id, ProducerGroup: "g", State: txlog.StateRolledBack,
					ResolvedBy: txlog.ByLocalRollback, Properties: txlog.HalfProperties("H1"), CreatedAt: old, ResolvedAt: old})
				require.NoError(t, err)
				// A retrying Send begins on the skewed clock and sends half H2.
				startedAt := time.Now().Add(s)
				a := checker.CheckQuery(ctx, checkback.Query{EventID: id, Group: "g", HalfKey: "H2", BornAt: startedAt})
				t.Logf("check of H2: %s (%s), apparent age %s", a.Decision, a.Reason, a.Age)
				tx, err := db.BeginTxx(ctx, nil)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback() }()
				took, err := store.Retake(ctx, tx, txlog.Row{EventID: id, ProducerGroup: "g", State: txlog.StateCommitted,
					ResolvedBy: txlog.ByLocalCommit, Properties: txlog.HalfProperties("H2")}, startedAt)
				require.NoError(t, err)
				if s < 0 {
					// H2 looks 30 s old: fenced at once, and then final.
					require.Equal(t, checkback.Rollback, a.Decision)
					require.False(t, took, "a half answered ROLLBACK must never take the id over")
				} else {
					// H2 looks born in the future: young, not fenced, and
					// the Send may still take the id.
					require.Equal(t, checkback.Unknown, a.Decision)
					require.Equal(t, checkback.ReasonYoung, a.Reason)
					require.True(t, took, "an unfenced half may take the id over")
				}
			})
		}
	})
}
