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

// The check reads committed data only, whatever isolation level its pool's
// sessions default to (a DSN session setting), on each database: a local
// transaction that has inserted its COMMITTED txlog row but not committed
// is never answered COMMIT (at READ UNCOMMITTED MariaDB's sessions can read
// that row). While it runs, a young check answers UNKNOWN, and an old one
// waits on its row lock, bounded by QueryTimeout. Once it ends, the answer is
// its outcome: ROLLBACK if it rolled back; COMMIT if it committed, also for
// a check whose fence was waiting on the row when the commit came (the fence
// acts on the latest committed row at every level; PostgreSQL's REPEATABLE
// READ and SERIALIZABLE would fail it with a serialization failure). The
// check is asked directly here, for each age rule;
// TestBrokerCheckReadsCommittedOnly has the real broker ask it. (Package
// discard proves the same for recovery.)
func TestCheckReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx := context.Background()
		require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
		for _, level := range testenv.IsolationLevels {
			for _, end := range []string{"rollback", "commit"} {
				t.Run(level+"/"+end, func(t *testing.T) { testCheckReadsCommittedOnly(t, db, level, end == "commit") })
			}
		}
	})
}

func testCheckReadsCommittedOnly(t *testing.T, db *sqlx.DB, level string, commits bool) {
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ctx := context.Background()
	pool, err := txlog.New(testenv.SessionIsolationDB(t, db, level), txlog.DefaultPrefix)
	require.NoError(t, err)
	checker := func(timeout time.Duration) *checkback.Checker {
		c, err := checkback.New(checkback.Config{Log: pool, Group: "g", FenceAge: 4 * time.Second, QueryTimeout: timeout})
		require.NoError(t, err)
		return c
	}
	c := checker(500 * time.Millisecond)

	id := wire.NewEventID()
	body := []byte(`{"ghost":true}`)
	row := committedRow(id, "orders", "u1", body)
	row.ProducerGroup = "g"
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	require.NoError(t, store.Insert(ctx, tx, row)) // in flight: inserted first, not committed
	var dirty int
	require.NoError(t, pool.DB().Get(&dirty, pool.DB().Rebind("SELECT COUNT(*) FROM "+pool.Table()+" WHERE event_id = ?"), id))
	if db.DriverName() == "mysql" && level == testenv.ReadUncommitted {
		require.Equal(t, 1, dirty, "precondition: the session reads uncommitted rows")
	} else {
		require.Zero(t, dirty, "no dirty reads at %s", level)
	}

	q := checkback.Query{EventID: id, Topic: "orders", PayloadHash: wire.Hash(body), HalfKey: "u1"}
	young := q
	young.BornAt = time.Now()
	a := c.CheckQuery(ctx, young)
	require.Equal(t, checkback.Unknown, a.Decision, "an in-flight transaction is not committed: %+v", a)
	require.Equal(t, checkback.ReasonYoung, a.Reason)

	old := q
	old.BornAt = time.Now().Add(-time.Minute)
	if !commits {
		a = c.CheckQuery(ctx, old)
		require.Equal(t, checkback.Unknown, a.Decision, "the fence waits on the row lock: %+v", a)
		require.Equal(t, checkback.ReasonError, a.Reason)
		require.Less(t, a.Duration, 3*time.Second, "bounded by QueryTimeout")

		require.NoError(t, tx.Rollback()) // the local transaction fails
		// The fence of the timed-out check may still complete on the server
		// once the lock is released: the row then exists (found) or is
		// written now (fenced); either way the answer is ROLLBACK.
		a = c.CheckQuery(ctx, old)
		require.Equal(t, checkback.Rollback, a.Decision, "%+v", a)
		require.Contains(t, []checkback.Reason{checkback.ReasonFenced, checkback.ReasonFound}, a.Reason)
		a = c.CheckQuery(ctx, young)
		require.Equal(t, checkback.Rollback, a.Decision, "final once decided")
		return
	}

	// A check whose fence waits on the row while the local transaction
	// commits answers COMMIT. (No check timed out before it: the statement
	// of a timed-out fence may wait on for a while on the server, and the
	// wait below must see this check's own.)
	waiting := make(chan checkback.Answer, 1)
	go func() { waiting <- checker(30*time.Second).CheckQuery(ctx, old) }()
	prefix := "INSERT IGNORE INTO " + pool.Table()
	if db.DriverName() != "mysql" {
		prefix = "INSERT INTO " + pool.Table()
	}
	testenv.Eventually(t, 20*time.Second, "the fence waits on the row lock", func() bool {
		n, err := testenv.LockWaiters(db, prefix)
		require.NoError(t, err)
		return n > 0
	})
	require.NoError(t, tx.Commit())
	a = <-waiting
	require.Equal(t, checkback.Commit, a.Decision, "the fence met the committed row: %+v", a)
	require.Equal(t, checkback.ReasonFenced, a.Reason, "answered by the fence that waited, not by a read after the commit")
	a = c.CheckQuery(ctx, young)
	require.Equal(t, checkback.Commit, a.Decision, "final once decided: %+v", a)
	require.Equal(t, checkback.ReasonFound, a.Reason)
	got, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, txlog.ByLocalCommit, got.ResolvedBy, "the local commit decided, not the fence")
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

// The same guarantee with the real broker asking, on each database: a
// transactional producer whose pool's sessions default to READ UNCOMMITTED
// (MariaDB's sessions then read uncommitted rows) or SERIALIZABLE (its
// local transactions and its checks both run on them) holds a local
// transaction open after its COMMITTED txlog row is inserted, until the
// broker has checked the half message while it was young and again past the
// fence age (so both of the check's rules ran). No check answers COMMIT. The
// local transaction then fails: Send reports the rollback, and an
// independent consumer sees no copy of the event by the time a marker sent
// after it arrives.
func TestBrokerCheckReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx := context.Background()
		require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
		_, err := db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY)")
		require.NoError(t, err)
		for _, level := range []string{testenv.ReadUncommitted, testenv.Serializable} {
			t.Run(level, func(t *testing.T) {
				t.Parallel()
				testBrokerCheckReadsCommittedOnly(t, db, level)
			})
		}
	})
}

func testBrokerCheckReadsCommittedOnly(t *testing.T, db *sqlx.DB, level string) {
	s := testenv.Integration(t)
	ctx := context.Background()
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ru := testenv.SessionIsolationDB(t, db, level)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	coll := testenv.Collect(t, topic)

	// The test broker checks a half first at 3 to 5 s (timeout 3 s, interval
	// 2 s): that check finds it young, a later one past the fence age.
	const fenceAge = 6 * time.Second
	id := "iso-" + testenv.RandSuffix(8)
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
		_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (id) VALUES (?)"), id)
		return err
	}

	declined := errors.New("declined after the checks")
	var dirty int
	res, err := p.Send(ctx, msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
		if err := insertOrder(ctx, tx, id); err != nil {
			return err
		}
		// Precondition (MariaDB at READ UNCOMMITTED): a session of the
		// producer's pool reads this transaction's uncommitted txlog row.
		if err := ru.GetContext(ctx, &dirty, ru.Rebind("SELECT COUNT(*) FROM "+store.Table()+" WHERE event_id = ?"), id); err != nil {
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
	if db.DriverName() == "mysql" && level == testenv.ReadUncommitted {
		require.Equal(t, 1, dirty, "precondition: the producer's sessions read uncommitted rows")
	} else {
		require.Zero(t, dirty, "no dirty reads at %s", level)
	}
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
