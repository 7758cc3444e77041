package checkback_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// The check reads committed data only, even through a pool whose sessions
// default to READ UNCOMMITTED: a local transaction that has inserted its
// COMMITTED txlog row but not committed (and then fails) is never answered
// COMMIT. The check stays bounded while it waits on that transaction's row
// lock. (Package discard proves the same for recovery.) The check is asked
// directly here, for each age rule; TestBrokerCheckReadsCommittedOnly has
// the real broker ask it.
func TestCheckReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
	ru, err := txlog.New(testenv.ReadUncommittedDB(t, db), txlog.DefaultPrefix)
	require.NoError(t, err)

	c, err := checkback.New(checkback.Config{Log: ru, Group: "g", FenceAge: 4 * time.Second, QueryTimeout: 500 * time.Millisecond})
	require.NoError(t, err)

	id := wire.NewEventID()
	body := []byte(`{"ghost":true}`)
	row := committedRow(id, "orders", "u1", body)
	row.ProducerGroup = "g"
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Insert(ctx, tx, row)) // in flight: inserted first, not committed
	var dirty int
	require.NoError(t, ru.DB().Get(&dirty, "SELECT COUNT(*) FROM "+ru.Table()+" WHERE event_id = ?", id))
	require.Equal(t, 1, dirty, "precondition: the session reads uncommitted rows")

	q := checkback.Query{EventID: id, Topic: "orders", PayloadHash: wire.Hash(body)}
	young := q
	young.BornAt = time.Now()
	a := c.CheckQuery(ctx, young)
	require.Equal(t, checkback.Unknown, a.Decision, "an in-flight transaction is not committed: %+v", a)
	require.Equal(t, checkback.ReasonYoung, a.Reason)

	old := q
	old.BornAt = time.Now().Add(-time.Minute)
	a = c.CheckQuery(ctx, old)
	require.Equal(t, checkback.Unknown, a.Decision, "the fence waits on the row lock: %+v", a)
	require.Equal(t, checkback.ReasonError, a.Reason)
	require.Less(t, a.Duration, 3*time.Second, "bounded by QueryTimeout")

	require.NoError(t, tx.Rollback()) // the local transaction fails
	// The fence of the timed-out check may still complete on the server once
	// the lock is released: the row then exists (found) or is written now
	// (fenced); either way the answer is ROLLBACK.
	a = c.CheckQuery(ctx, old)
	require.Equal(t, checkback.Rollback, a.Decision, "%+v", a)
	require.Contains(t, []checkback.Reason{checkback.ReasonFenced, checkback.ReasonFound}, a.Reason)
	a = c.CheckQuery(ctx, young)
	require.Equal(t, checkback.Rollback, a.Decision, "final once decided")
}

// checkAnswers records a producer's check answers for one event id.
type checkAnswers struct {
	id      string
	mu      sync.Mutex
	answers []checkback.Answer
	changed chan struct{}
}

func (c *checkAnswers) add(a checkback.Answer) {
	if a.EventID != c.id {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answers = append(c.answers, a)
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *checkAnswers) get() []checkback.Answer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]checkback.Answer(nil), c.answers...)
}

// wait blocks until cond holds for the answers, or ctx ends.
func (c *checkAnswers) wait(ctx context.Context, cond func([]checkback.Answer) bool) error {
	for {
		c.mu.Lock()
		ok, ch := cond(c.answers), c.changed
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// The same guarantee with the real broker asking: a transactional producer
// whose pool's sessions default to READ UNCOMMITTED (its local transactions
// and its checks both run on them) holds a local transaction open after its
// COMMITTED txlog row is inserted, until the broker has checked the half
// message while it was young and again past the fence age (so both of the
// check's rules ran). No check answers COMMIT, although the
// sessions can read the uncommitted row. The local transaction then fails:
// Send reports the rollback, and an independent consumer sees no copy of the
// event by the time a marker sent after it arrives.
func TestBrokerCheckReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	db := testenv.DB(t)
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
	_, err := db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY)")
	require.NoError(t, err)
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ru := testenv.ReadUncommittedDB(t, db)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	coll := testenv.Collect(t, topic)

	// The test broker checks a half first at 3 to 5 s (timeout 3 s, interval
	// 2 s): that check finds it young, a later one past the fence age.
	const fenceAge = 6 * time.Second
	id := "ru-" + testenv.RandSuffix(8)
	checks := &checkAnswers{id: id, changed: make(chan struct{})}
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{s.NameServer}, Group: testenv.Name(t, "pg"), DB: ru,
		FenceAge: fenceAge, CheckTimeout: 2 * time.Second, WarmupTopics: []string{topic},
		DisableRecovery: true, OnCheck: checks.add,
	})
	require.NoError(t, err)
	startCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.Start(startCtx))
	t.Cleanup(func() { _ = p.Close() })
	msg := func(id string) txproducer.Message {
		return txproducer.Message{Topic: topic, EventID: id, EventType: "OrderPlaced", BusinessKey: "order-" + id,
			Payload: []byte(`{"order":"` + id + `"}`)}
	}
	insertOrder := func(ctx context.Context, tx *sqlx.Tx, id string) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", id)
		return err
	}

	declined := errors.New("declined after the checks")
	var dirty int
	res, err := p.Send(ctx, msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
		if err := insertOrder(ctx, tx, id); err != nil {
			return err
		}
		// Precondition: a session of the producer's pool reads this
		// transaction's uncommitted txlog row.
		if err := ru.GetContext(ctx, &dirty, "SELECT COUNT(*) FROM "+store.Table()+" WHERE event_id = ?", id); err != nil {
			return err
		}
		// Hold the transaction open until the broker checked the half
		// young and past the fence age (that check waits on the row lock,
		// bounded by CheckTimeout).
		return errors.Join(declined, checks.wait(ctx, func(as []checkback.Answer) bool {
			young, old := false, false
			for _, a := range as {
				young = young || a.Age < fenceAge
				old = old || a.Age >= fenceAge
			}
			return young && old
		}))
	})
	require.ErrorIs(t, err, txproducer.ErrLocalTx)
	require.ErrorIs(t, err, declined)
	require.NotErrorIs(t, err, context.DeadlineExceeded, "the broker checked the half young and past the fence age within LocalTxTimeout")
	require.Equal(t, txproducer.StateRolledBack, res.State)
	require.Equal(t, 1, dirty, "precondition: the producer's sessions read uncommitted rows")
	during := checks.get()
	require.NotEmpty(t, during)
	for _, a := range during {
		require.NotEqual(t, checkback.Commit, a.Decision, "a check answered COMMIT for a transaction still running: %+v", a)
	}

	// No ghost: a marker committed after the rollback arrives, and the
	// event never did.
	marker := "marker-" + testenv.RandSuffix(8)
	mres, err := p.Send(ctx, msg(marker), func(ctx context.Context, tx *sqlx.Tx) error { return insertOrder(ctx, tx, marker) })
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, mres.State)
	require.True(t, coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[marker] > 0 }), "marker not consumed")
	require.Zero(t, coll.Snapshot().Counts[id], "copies of the rolled-back event on the topic")
	var orders int
	require.NoError(t, db.Get(&orders, db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	require.Zero(t, orders, "business rows of the rolled-back event")
	for _, a := range checks.get() {
		require.NotEqual(t, checkback.Commit, a.Decision, "%+v", a)
	}
	r, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, txlog.StateRolledBack, r.State)
	t.Logf("check answers by the time Send returned: %d (%+v)", len(during), during)
}
