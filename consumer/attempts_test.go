package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

func attemptRows(t testing.TB, db *sqlx.DB, group, id string) int {
	t.Helper()
	return countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE consumer_group = ? AND event_id = ?", group, id)
}

// failFirstRun fails the first run of target with a transient error and
// applies every other run.
func failFirstRun(target string, runs *runCounter) Handler {
	return func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
		if runs.add(ev.ID) == 1 && ev.ID == target {
			return Transient(errors.New("partner timeout"))
		}
		return effectHandler(ctx, tx, ev)
	}
}

// The first copy of an event fails (a retry is scheduled, an attempt row
// written); a second copy of the same event (ReconsumeTimes 0: a duplicate
// publish, as a double commit or a redelivery makes) applies it. The success
// must take the attempt row with it, although it is not a retry; the first
// copy's retry is then a dedup hit. Before the fix the row stayed forever
// and `rmqtx stuck` listed a finished event as RETRYING.
func TestAttemptClearedWhenAnotherCopyApplies(t *testing.T) {
	t.Parallel()
	eachDB(t, testAttemptClearedWhenAnotherCopyApplies)
}

func testAttemptClearedWhenAnotherCopyApplies(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 1)
	col := testenv.Collect(t, topic)
	target := wire.NewEventID()
	var runs runCounter
	// The retry comes back after 10s (level 3): the second copy applies long
	// before it, so what clears the row below is that success.
	c := startConsumer(t, db, topic, group, map[string]Route{"Created": {Handler: failFirstRun(target, &runs)}},
		func(c *Config) { c.DelayLevel = func(Class, int) int { return 3 } })
	pb := newPublisher(t)
	payload := []byte(`{"amount":100}`)

	pb.send(topic, ev(target, "Created"), payload)
	testenv.Eventually(t, 60*time.Second, "the first copy failed and its attempt was recorded", func() bool {
		return c.Processor().Stats().Retries == 1 && attemptRows(t, db, group, target) == 1
	})

	pb.send(topic, ev(target, "Created"), payload) // the second copy, ReconsumeTimes 0
	testenv.Eventually(t, 60*time.Second, "the second copy applied", func() bool { return c.Processor().Stats().Applied == 1 })
	require.Zero(t, c.Processor().Stats().Duplicates, "the first copy's retry has not come back yet")
	require.Equal(t, 0, attemptRows(t, db, group, target), "the success cleared the attempt row")
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE consumer_group = ? AND event_id = ? AND status = 'SUCCESS'", group, target))

	testenv.Eventually(t, 60*time.Second, "the first copy's retry is a dedup hit", func() bool { return c.Processor().Stats().Duplicates == 1 })
	require.Equal(t, 0, attemptRows(t, db, group, target))
	require.Equal(t, 1, effects(t, db), "one effect")
	require.Equal(t, 2, runs.get(target), "the handler ran for the failure and the success only")
	require.True(t, col.WaitUntil(30*time.Second, func(s testenv.Snapshot) bool { return s.Counts[target] == 2 }),
		"the broker holds two copies of the event on the topic")
	s := c.Processor().Stats()
	t.Logf("COUNTS attempt cleared by another copy: copies_on_topic=%d handler_runs=%d applied=%d retries=%d dedup_hits=%d attempt_rows=%d",
		col.Snapshot().Counts[target], runs.get(target), s.Applied, s.Retries, s.Duplicates, attemptRows(t, db, group, target))
}

// The first copy fails on this instance; another instance of the group,
// which never saw the failure, applies a second copy and cannot know there
// is an attempt row. The first copy's retry (from the broker's retry topic)
// is then a dedup hit here, and that hit clears the row.
func TestAttemptClearedByDedupHitOfTheRetry(t *testing.T) {
	t.Parallel()
	eachDB(t, testAttemptClearedByDedupHitOfTheRetry)
}

func testAttemptClearedByDedupHitOfTheRetry(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 1)
	col := testenv.Collect(t, topic)
	target := wire.NewEventID()
	var runs runCounter
	routes := map[string]Route{"Created": {Handler: failFirstRun(target, &runs)}}
	c := startConsumer(t, db, topic, group, routes, func(c *Config) { c.DelayLevel = func(Class, int) int { return 2 } })
	// another instance, without crash counting (with it, its success would
	// delete the row it counted itself)
	other, err := NewProcessor(ProcessorConfig{Group: group, DB: db, Routes: routes, NoCrashCount: true})
	require.NoError(t, err)
	pb := newPublisher(t)
	payload := []byte(`{"amount":100}`)

	pb.send(topic, ev(target, "Created"), payload)
	testenv.Eventually(t, 60*time.Second, "the first copy failed and its attempt was recorded", func() bool {
		return attemptRows(t, db, group, target) == 1
	})
	o := other.Process(context.Background(), msg(ev(target, "Created"), string(payload)))
	require.Equal(t, ResultApplied, o.Result)
	require.Equal(t, 1, attemptRows(t, db, group, target), "the other instance had no sign of the failure")

	testenv.Eventually(t, 60*time.Second, "the retry's dedup hit cleared the attempt row", func() bool {
		return c.Processor().Stats().Duplicates == 1 && attemptRows(t, db, group, target) == 0
	})
	require.Equal(t, 1, effects(t, db))
	require.Zero(t, c.Processor().Stats().Applied)
	require.True(t, col.WaitUntil(30*time.Second, func(s testenv.Snapshot) bool { return s.Counts[target] == 1 }),
		"the broker holds one copy on the topic; the retry went through the group's retry topic")
	t.Logf("COUNTS attempt cleared by dedup hit: copies_on_topic=%d handler_runs=%d dedup_hits=%d attempt_rows=%d",
		col.Snapshot().Counts[target], runs.get(target), c.Processor().Stats().Duplicates, attemptRows(t, db, group, target))
}

// The cached and the database dedup hits of an event this process saw
// failing clear its attempt row, as does a success after a restart (the
// attempt ids are loaded at Start). A first delivery of an event that never
// failed issues no delete (it cannot be observed here, but the counts of
// attempt rows of other events must not change either).
func TestAttemptClearedOnEveryDedupPath(t *testing.T) {
	t.Parallel()
	eachDB(t, testAttemptClearedOnEveryDedupPath)
}

func testAttemptClearedOnEveryDedupPath(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	fail := map[string]bool{}
	var runs runCounter
	handler := func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
		if fail[ev.ID] && runs.add(ev.ID) == 1 {
			return Transient(errors.New("first run fails"))
		}
		return effectHandler(ctx, tx, ev)
	}
	// Without crash counting, which would mark every attempt counted
	// (crash.go): this is the uncounted path's bookkeeping.
	cfg := ProcessorConfig{Group: testenv.Name(t, "g"), DB: db, Routes: map[string]Route{"Created": {Handler: handler}}, NoCrashCount: true}
	group := cfg.Group
	newP := func(mut func(*ProcessorConfig)) *Processor {
		c := cfg
		if mut != nil {
			mut(&c)
		}
		p, err := NewProcessor(c)
		require.NoError(t, err)
		return p
	}
	retry := func(m Message) Message { m.Delivery.ReconsumeTimes = 1; return m }

	// Cached dedup hit: p applied the event itself (a second copy, no
	// retry), then the row is written again by another instance's failure
	// of a third copy; the retry of that copy reaches p's cache.
	cached := wire.NewEventID()
	fail[cached] = true
	p := newP(nil)
	require.Equal(t, ResultRetry, p.Process(ctx, msg(ev(cached, "Created"), "x")).Result)
	require.Equal(t, 1, attemptRows(t, db, group, cached))
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(cached, "Created"), "x")).Result, "second copy, ReconsumeTimes 0")
	require.Equal(t, 0, attemptRows(t, db, group, cached), "the success cleared the row in its transaction")
	now := time.Now().UTC()
	exec(t, db, "INSERT INTO rmqtx_consume_attempt (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at)"+
		" VALUES (?, ?, 1, 'transient', 'elsewhere', ?, ?)", group, cached, now, now)
	hits := p.DedupCacheStats().Hits
	require.Equal(t, ResultDuplicate, p.Process(ctx, retry(msg(ev(cached, "Created"), "x"))).Result)
	require.Equal(t, hits+1, p.DedupCacheStats().Hits, "answered from the cache")
	require.Equal(t, 0, attemptRows(t, db, group, cached), "the cached dedup hit of a retry cleared the row")

	// Database dedup hit of an id this process saw failing, delivered with
	// ReconsumeTimes 0 (no cache, so the database answers).
	dbHit := wire.NewEventID()
	fail[dbHit] = true
	q := newP(func(c *ProcessorConfig) { c.DedupCacheSize = -1 })
	require.Equal(t, ResultRetry, q.Process(ctx, msg(ev(dbHit, "Created"), "y")).Result)
	require.Equal(t, ResultApplied, newP(nil).Process(ctx, msg(ev(dbHit, "Created"), "y")).Result, "another instance applies it")
	require.Equal(t, 1, attemptRows(t, db, group, dbHit))
	require.Equal(t, ResultDuplicate, q.Process(ctx, msg(ev(dbHit, "Created"), "y")).Result)
	require.Equal(t, 0, attemptRows(t, db, group, dbHit), "the database dedup hit cleared the row")

	// Restart: the failure was recorded by a process that is gone; the new
	// one loads the attempt ids and its first-delivery success clears it.
	restarted := wire.NewEventID()
	fail[restarted] = true
	require.Equal(t, ResultRetry, newP(nil).Process(ctx, msg(ev(restarted, "Created"), "z")).Result)
	fresh := newP(nil)
	require.NoError(t, fresh.loadFailed(ctx))
	require.Equal(t, ResultApplied, fresh.Process(ctx, msg(ev(restarted, "Created"), "z")).Result)
	require.Equal(t, 0, attemptRows(t, db, group, restarted), "the restarted process knew the id")

	// An event that never failed: applied, no attempt row before or after.
	plain := wire.NewEventID()
	require.Equal(t, ResultApplied, fresh.Process(ctx, msg(ev(plain, "Created"), "w")).Result)
	require.Zero(t, fresh.failed.len(), "nothing left to clear")
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt"))
	require.Equal(t, 4, effects(t, db))
}

// The failed-id set is bounded, evicts the oldest first, and an id removed
// and added again is not evicted by its old entry.
func TestFailedSetBound(t *testing.T) {
	t.Parallel()
	s := newFailedSet(3)
	for i := range 3 {
		s.add(fmt.Sprint(i))
	}
	require.Equal(t, 3, s.len())
	s.remove("1")
	require.False(t, s.has("1"))
	s.add("1") // the set is full: the oldest entry, "0", goes
	require.False(t, s.has("0"))
	s.add("3") // evicts the stale first entry of "1", which must survive
	require.True(t, s.has("1"), "a re-added id is not evicted by its old entry")
	require.True(t, s.has("2") && s.has("3"))
	require.Equal(t, 3, s.len())
	s.add("4") // evicts "2"
	require.False(t, s.has("2"))
	require.Equal(t, 3, s.len())
}

// The attempt bookkeeping costs the common path nothing: first deliveries of
// events that never failed run no DELETE and no extra read; only the success
// of an event seen failing deletes its row. Counted with the server's own
// statement counters on the pool's single connection.
func TestAttemptBookkeepingCostsNoStatementOnFirstDeliveries(t *testing.T) {
	t.Parallel()
	// MariaDB only: the count reads the session's per-statement-kind
	// counters (SHOW SESSION STATUS), which PostgreSQL does not keep per
	// session. The statements are the same on both databases.
	db := setupDB(t, testenv.MySQLDB(t))
	one := testenv.Reopen(t, db)
	one.SetMaxOpenConns(1)
	one.SetMaxIdleConns(1)
	ctx := context.Background()
	status := func() map[string]int {
		rows, err := one.QueryxContext(ctx, "SHOW SESSION STATUS WHERE Variable_name IN ('Com_delete', 'Com_select', 'Com_insert', 'Com_commit')")
		require.NoError(t, err)
		defer rows.Close()
		out := map[string]int{}
		for rows.Next() {
			var k string
			var v int
			require.NoError(t, rows.Scan(&k, &v))
			out[k] = v
		}
		require.NoError(t, rows.Err())
		return out
	}
	failing := wire.NewEventID()
	var runs runCounter
	p := newProc(t, one, func(c *ProcessorConfig) {
		c.Routes["Created"] = Route{Handler: failFirstRun(failing, &runs)}
		c.NoCrashCount = true // without crash counting; with it: TestCrashCountCost
	})

	before := status()
	const n = 20
	for i := range n {
		require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(wire.NewEventID(), "Created"), fmt.Sprint(i))).Result)
	}
	after := status()
	require.Equal(t, before["Com_delete"], after["Com_delete"], "no DELETE on first deliveries")
	require.Equal(t, before["Com_select"], after["Com_select"], "no extra read on first deliveries")
	require.Equal(t, 2*n, after["Com_insert"]-before["Com_insert"], "the dedup row and the handler's effect, per event")
	t.Logf("statements for %d first deliveries: %v -> %v", n, before, after)

	require.Equal(t, ResultRetry, p.Process(ctx, msg(ev(failing, "Created"), "f")).Result)
	before = status()
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(failing, "Created"), "f")).Result, "another copy, ReconsumeTimes 0")
	after = status()
	require.Equal(t, 1, after["Com_delete"]-before["Com_delete"], "the success of an event seen failing deletes its attempt row")
	require.Equal(t, 0, attemptRows(t, db, p.Config().Group, failing))
}
