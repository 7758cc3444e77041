package txproducer_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/rmqtxtest"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// The producer's decision logic on the in-process broker of rmqtxtest: what
// a check answers from each txlog state, fencing, a duplicate Send, a lost
// END_TRANSACTION, a discarded half. The broker checks only when the test
// calls CheckNow, so each test asks for exactly the checks it asserts on
// instead of waiting for the real broker's check interval. The real-broker
// tests named on each test stay the proof of the same invariant against
// RocketMQ itself.

// kitBed is one kit test's world: the in-process broker, a migrated
// database with the business table, a topic and the check answers.
type kitBed struct {
	b     *rmqtxtest.Broker
	db    *sqlx.DB
	store *txlog.Store
	topic string
	rec   *kitAnswers
}

// kitEachDB runs body on a fresh kitBed on each database, the two as
// parallel subtests, and logs how long each took.
func kitEachDB(t *testing.T, body func(t *testing.T, k *kitBed)) {
	t.Helper()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		start := time.Now()
		store, err := txlog.New(db, txlog.DefaultPrefix)
		require.NoError(t, err)
		require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
		_, err = db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, amount INT NOT NULL)")
		require.NoError(t, err)
		k := &kitBed{b: rmqtxtest.NewBroker(t), db: db, store: store, topic: testenv.Name(t, "topic"), rec: &kitAnswers{}}
		k.b.CreateTopic(k.topic, 1)
		body(t, k)
		t.Logf("%s: %s", t.Name(), time.Since(start).Round(time.Millisecond))
	})
}

// producer starts a kit producer on k's database that reports its check
// answers to k.rec; mut adjusts the config first.
func (k *kitBed) producer(t *testing.T, mut func(*txproducer.Config)) *txproducer.Producer {
	t.Helper()
	cfg := txproducer.Config{DB: k.db, OnCheck: k.rec.add}
	if mut != nil {
		mut(&cfg)
	}
	return rmqtxtest.NewProducer(t, k.b, cfg)
}

// msg is a keyed message (a business key: rmqtx ends its commit with a
// request and waits for the broker).
func (k *kitBed) msg(id string) txproducer.Message {
	return txproducer.Message{Topic: k.topic, EventID: id, EventType: "OrderPlaced", BusinessKey: "order-" + id,
		Payload: []byte(`{"order":"` + id + `"}`)}
}

// checkNow runs one check round and returns how many checks were sent.
func (k *kitBed) checkNow(t *testing.T) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := k.b.CheckNow(ctx)
	require.NoError(t, err)
	return n
}

// copies counts the visible messages of k's topic that carry event id.
func (k *kitBed) copies(id string) int {
	n := 0
	for _, m := range k.b.Messages(k.topic) {
		if m.Properties[wire.PropEventID] == id {
			n++
		}
	}
	return n
}

// pendingHalf reports whether a half of event id is pending on the broker.
func (k *kitBed) pendingHalf(id string) bool {
	for _, h := range k.b.Pending() {
		if h.Properties[wire.PropEventID] == id {
			return true
		}
	}
	return false
}

// rolledBack reports whether the half with UNIQ_KEY msgID was rolled back.
func (k *kitBed) rolledBack(msgID string) bool {
	for _, h := range k.b.RolledBack() {
		if h.MsgID == msgID {
			return true
		}
	}
	return false
}

// waitRolledBack waits until the half with UNIQ_KEY msgID is rolled back:
// a Send that rolls back ends its half with the client's one-way
// END_TRANSACTION, which the broker may handle after Send returned.
func (k *kitBed) waitRolledBack(t *testing.T, msgID, what string) {
	t.Helper()
	require.NotEmpty(t, msgID, what)
	testenv.Eventually(t, 10*time.Second, what, func() bool { return k.rolledBack(msgID) })
}

func (k *kitBed) row(t *testing.T, id string) txlog.Row {
	t.Helper()
	r, err := k.store.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}

// kitOrder inserts the business row of id and counts its runs.
func kitOrder(id string, runs *atomic.Int32) txproducer.LocalTxFunc {
	return func(ctx context.Context, tx *sqlx.Tx) error {
		runs.Add(1)
		_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (id, amount) VALUES (?, 1)"), id)
		return err
	}
}

// kitAnswers records the producer's check answers per event id.
type kitAnswers struct {
	mu sync.Mutex
	by map[string][]checkback.Answer
}

func (a *kitAnswers) add(x checkback.Answer) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by == nil {
		a.by = map[string][]checkback.Answer{}
	}
	a.by[x.EventID] = append(a.by[x.EventID], x)
}

func (a *kitAnswers) of(id string) []checkback.Answer {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]checkback.Answer(nil), a.by[id]...)
}

// requireAnswers asserts id's check answers, in order, as decision/reason
// pairs.
func (a *kitAnswers) require(t *testing.T, id string, want ...checkback.Answer) {
	t.Helper()
	got := a.of(id)
	require.Len(t, got, len(want), "check answers of %s: %+v", id, got)
	for i, w := range want {
		require.Equal(t, w.Decision, got[i].Decision, "answer %d of %s: %+v", i, id, got[i])
		require.Equal(t, w.Reason, got[i].Reason, "answer %d of %s: %+v", i, id, got[i])
	}
}

func answer(d checkback.Decision, r checkback.Reason) checkback.Answer {
	return checkback.Answer{Decision: d, Reason: r}
}

// The check's decision table, one check round on three pending halves: a
// COMMITTED row (END lost) answers COMMIT, a ROLLED_BACK row (END lost)
// answers ROLLBACK, a half whose local transaction is still open (its row
// not committed yet) and younger than FenceAge answers UNKNOWN. The broker
// acts on each answer: one copy of the committed event, none of the rolled
// back one, and the open one is delivered once its Send commits.
// Real-broker proof: TestRollbacks (ROLLED_BACK and young UNKNOWN) and
// TestCrashAfterLocalCommit (COMMITTED row, END never sent).
func TestKitCheckAnswersFromTxlog(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		committed, rolled, open := "c-"+testenv.RandSuffix(8), "r-"+testenv.RandSuffix(8), "o-"+testenv.RandSuffix(8)
		p := k.producer(t, func(c *txproducer.Config) {
			c.Test.LoseEnd = func(id string) bool { return id == committed || id == rolled }
		})
		ctx := context.Background()
		var runs atomic.Int32

		res, err := p.Send(ctx, k.msg(committed), kitOrder(committed, &runs))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		res, err = p.Send(ctx, k.msg(rolled), func(ctx context.Context, tx *sqlx.Tx) error {
			if err := kitOrder(rolled, &runs)(ctx, tx); err != nil {
				return err
			}
			return errBusiness
		})
		require.ErrorIs(t, err, errBusiness)
		require.Equal(t, txproducer.StateRolledBack, res.State)
		require.True(t, k.pendingHalf(committed) && k.pendingHalf(rolled), "both ENDs were lost: %+v", k.b.Pending())
		require.Zero(t, k.copies(committed), "not visible before a check commits it")

		// The third Send checks all three halves from inside its open
		// local transaction (its row is inserted, not committed).
		var checks int
		res, err = p.Send(ctx, k.msg(open), func(ctx context.Context, tx *sqlx.Tx) error {
			if err := kitOrder(open, &runs)(ctx, tx); err != nil {
				return err
			}
			checks = k.checkNow(t)
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		require.Equal(t, 3, checks)
		k.rec.require(t, committed, answer(checkback.Commit, checkback.ReasonFound))
		k.rec.require(t, rolled, answer(checkback.Rollback, checkback.ReasonFound))
		k.rec.require(t, open, answer(checkback.Unknown, checkback.ReasonYoung))

		require.Empty(t, k.b.Pending(), "every half decided")
		require.Zero(t, k.checkNow(t), "nothing left to check")
		require.Equal(t, 1, k.copies(committed))
		require.Equal(t, 1, k.copies(open))
		require.Zero(t, k.copies(rolled))
		require.Len(t, k.b.Messages(k.topic), 2)
		var orders int
		require.NoError(t, k.db.Get(&orders, "SELECT COUNT(*) FROM orders"))
		require.Equal(t, 2, orders)
	})
}

// The END_TRANSACTION of an unkeyed commit (the client's one-way end) is
// dropped by the broker: the Send reports the commit (it cannot know), the
// half stays pending and invisible, and the first check commits it from the
// txlog. A keyed commit whose END request is dropped too: the Send waits
// SendTimeout for the answer, still reports the commit, and the check
// delivers it. One copy each.
// Real-broker proof: TestCrashAfterLocalCommit and TestCrashAfterEndTransaction.
func TestKitLostEndTransactionCommitsOnCheck(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		p := k.producer(t, nil)
		ctx := context.Background()
		var runs atomic.Int32

		unkeyed := "u-" + testenv.RandSuffix(8)
		m := k.msg(unkeyed)
		m.BusinessKey = ""
		k.b.LoseEndTransaction(1)
		res, err := p.Send(ctx, m, kitOrder(unkeyed, &runs))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		require.True(t, k.pendingHalf(unkeyed), "the END was lost: the half is pending")
		require.Zero(t, k.copies(unkeyed))
		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, unkeyed, answer(checkback.Commit, checkback.ReasonFound))
		require.Equal(t, 1, k.copies(unkeyed))

		// A keyed Send ends its commit with a request (ordered commit) and
		// the client sends no end of its own: dropping that one request
		// leaves the half pending (the client's one-way UNKNOWN end, which
		// it used to send first, would have taken the drop instead).
		keyed := "k-" + testenv.RandSuffix(8)
		k.b.LoseEndTransaction(1)
		res, err = p.Send(ctx, k.msg(keyed), kitOrder(keyed, &runs))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		require.True(t, k.pendingHalf(keyed), "the one END was lost: the half is pending")
		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, keyed, answer(checkback.Commit, checkback.ReasonFound))
		require.Equal(t, 1, k.copies(keyed))
		require.Zero(t, k.checkNow(t))
		require.Len(t, k.b.Messages(k.topic), 2)
		require.EqualValues(t, 2, runs.Load())
	})
}

// A half whose Send never reached its local transaction (as if its
// producer had died after the half): a check before FenceAge answers
// UNKNOWN, a check past it fences the id (a ROLLED_BACK row, ResolvedBy
// FENCE) and answers ROLLBACK. The Send, let go after the fence, reports
// ErrFenced without running the function; a retry with the same id takes
// the id over and commits it, one copy.
// Real-broker proof: TestLongLocalTransaction/fence_wins and
// TestCrashAfterHalfMessage (failpoints).
func TestKitFenceUnfinishedHalf(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		const fenceAge = time.Second
		id := "f-" + testenv.RandSuffix(8)
		letGo := make(chan struct{})
		p := k.producer(t, func(c *txproducer.Config) {
			c.FenceAge = fenceAge
			// Longer than the hold below, so the held Send is fenced, not
			// timed out.
			c.LocalTxTimeout = 10 * time.Second
			c.Test.BeforeLocalTx = func(ctx context.Context, eventID string) {
				if eventID == id {
					select {
					case <-letGo:
					case <-ctx.Done():
					}
				}
			}
		})
		type outcome struct {
			res txproducer.Result
			err error
		}
		done := make(chan outcome, 1)
		var runs atomic.Int32
		go func() {
			res, err := p.Send(context.Background(), k.msg(id), kitOrder(id, &runs))
			done <- outcome{res, err}
		}()
		testenv.Eventually(t, 10*time.Second, "the held Send's half stored", func() bool { return k.pendingHalf(id) })
		// The client stamped the half before it was stored, so from here
		// the half is at least as old as the time since now.
		stored := time.Now()
		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, id, answer(checkback.Unknown, checkback.ReasonYoung))

		// The condition under test is the half's age: wait until it is past
		// FenceAge, then check once.
		<-time.After(time.Until(stored.Add(fenceAge)))
		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, id, answer(checkback.Unknown, checkback.ReasonYoung), answer(checkback.Rollback, checkback.ReasonFenced))
		require.Equal(t, txlog.ByFence, k.row(t, id).ResolvedBy)
		require.False(t, k.pendingHalf(id), "the broker rolled the half back")

		close(letGo)
		o := <-done
		require.ErrorIs(t, o.err, txproducer.ErrFenced)
		require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(o.err))
		require.Equal(t, txproducer.StateRolledBack, o.res.State)
		require.Zero(t, runs.Load(), "the function must not run once fenced")
		require.True(t, k.rolledBack(o.res.MsgID))

		res, err := p.Send(context.Background(), k.msg(id), kitOrder(id, &runs))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		require.False(t, res.Duplicate)
		require.Equal(t, 1, k.copies(id))
		require.EqualValues(t, 1, runs.Load())
	})
}

// A business-key id retried after a local failure whose END was lost: the
// retry takes the id over and commits it; the check of the first half
// answers ROLLBACK (the row names the retry's half), never COMMIT; a third
// Send is a Duplicate whose own half is rolled back and whose function does
// not run. One copy on the topic.
// Real-broker proof: TestRetrySameIDAfterLocalFailure.
func TestKitRetrySameIDAfterLocalFailure(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		id := "retry-" + testenv.RandSuffix(8)
		var lose atomic.Bool
		lose.Store(true)
		p := k.producer(t, func(c *txproducer.Config) {
			c.Test.LoseEnd = func(eventID string) bool { return eventID == id && lose.Load() }
		})
		ctx := context.Background()
		first, err := p.Send(ctx, k.msg(id), func(context.Context, *sqlx.Tx) error { return errBusiness })
		require.ErrorIs(t, err, errBusiness)
		require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err))
		require.Equal(t, first.MsgID, k.row(t, id).Half(), "the rollback names its half")
		lose.Store(false)

		var runs atomic.Int32
		again, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, again.State)
		require.False(t, again.Duplicate)
		require.Equal(t, again.MsgID, k.row(t, id).Half(), "the row names the retry's half")
		require.True(t, k.pendingHalf(id), "the first half is still pending")

		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, id, answer(checkback.Rollback, checkback.ReasonOtherHalf))
		require.True(t, k.rolledBack(first.MsgID))

		dup, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
		require.NoError(t, err)
		require.True(t, dup.Duplicate)
		k.waitRolledBack(t, dup.MsgID, "the duplicate's own half rolled back by its Send")
		require.EqualValues(t, 1, runs.Load())
		require.Zero(t, k.checkNow(t))
		require.Equal(t, 1, k.copies(id))
	})
}

// The same id sent again after it committed: Duplicate, the function does
// not run, the second half is rolled back by its Send; when that END is
// lost, the check answers ROLLBACK (other half). The same id with another
// payload is ErrEventIDConflict and its half, END lost too, is answered
// ROLLBACK (not the half the row names). The broker holds one copy.
// Real-broker proof: TestSendSameIDSequential.
func TestKitSendSameIDAgain(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		id := "seq-" + testenv.RandSuffix(8)
		var lose atomic.Bool
		p := k.producer(t, func(c *txproducer.Config) {
			c.Test.LoseEnd = func(eventID string) bool { return eventID == id && lose.Load() }
		})
		ctx := context.Background()
		var runs atomic.Int32
		first, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
		require.NoError(t, err)
		require.False(t, first.Duplicate)

		again, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
		require.NoError(t, err)
		require.True(t, again.Duplicate)
		k.waitRolledBack(t, again.MsgID, "the duplicate's own half rolled back by its Send")

		lose.Store(true)
		lost, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
		require.NoError(t, err)
		require.True(t, lost.Duplicate)
		require.True(t, k.pendingHalf(id))
		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, id, answer(checkback.Rollback, checkback.ReasonOtherHalf))
		require.True(t, k.rolledBack(lost.MsgID))

		other := k.msg(id)
		other.Payload = []byte(`{"order":"something else"}`)
		conflict, err := p.Send(ctx, other, kitOrder(id, &runs))
		require.ErrorIs(t, err, txproducer.ErrEventIDConflict)
		require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(err))
		require.Equal(t, txproducer.StateRolledBack, conflict.State)
		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, id, answer(checkback.Rollback, checkback.ReasonOtherHalf), answer(checkback.Rollback, checkback.ReasonOtherHalf))
		require.True(t, k.rolledBack(conflict.MsgID))

		require.EqualValues(t, 1, runs.Load(), "the function ran once")
		require.Equal(t, 1, k.copies(id))
		require.Len(t, k.b.Messages(k.topic), 1)
	})
}

// Halves the broker gives up on (DiscardHalves: as after CheckMax checks)
// go to TRANS_CHECK_MAX_TIME_TOPIC, and the producer's discard recovery
// decides each from the txlog: the committed event is published again, once;
// the rolled-back one is not.
// Real-broker proof: TestDiscardRecovery (failpoints).
func TestKitDiscardedHalvesRecovered(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		committed, rolled := "dc-"+testenv.RandSuffix(8), "dr-"+testenv.RandSuffix(8)
		var mu sync.Mutex
		decided := map[string]discard.Result{}
		changed := make(chan struct{}, 1)
		p := k.producer(t, func(c *txproducer.Config) {
			c.Test.LoseEnd = func(id string) bool { return id == committed || id == rolled }
			c.OnRecovery = func(r discard.Result) {
				mu.Lock()
				decided[r.EventID] = r
				mu.Unlock()
				select {
				case changed <- struct{}{}:
				default: // a signal is pending already; the waiter re-reads decided
				}
			}
		})
		ctx := context.Background()
		var runs atomic.Int32
		_, err := p.Send(ctx, k.msg(committed), kitOrder(committed, &runs))
		require.NoError(t, err)
		_, err = p.Send(ctx, k.msg(rolled), func(context.Context, *sqlx.Tx) error { return errBusiness })
		require.ErrorIs(t, err, errBusiness)

		dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := k.b.DiscardHalves(dctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		for {
			mu.Lock()
			done := len(decided) == 2
			mu.Unlock()
			if done {
				break
			}
			select {
			case <-changed:
			case <-dctx.Done():
				t.Fatalf("discard recovery decided %v", decided)
			}
		}
		msgs, err := k.b.WaitMessages(dctx, k.topic, 1)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.Equal(t, committed, msgs[0].Properties[wire.PropEventID])
		t.Logf("recovery decisions: %+v", decided)
		yes := true
		recovered, err := k.store.Count(ctx, txlog.Filter{Recovered: &yes})
		require.NoError(t, err)
		require.Equal(t, 2, recovered, "both halves' recovery is recorded in the txlog")
		require.Empty(t, k.rec.of(committed), "no check ran")
	})
}
