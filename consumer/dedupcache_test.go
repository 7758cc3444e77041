package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

func TestDedupCacheBoundAndEviction(t *testing.T) {
	t.Parallel()
	c := newDedupCache(3)
	for i := range 5 {
		c.add(fmt.Sprint("e", i), fmt.Sprint("h", i))
	}
	require.Equal(t, DedupCacheStats{Capacity: 3, Entries: 3}, c.stats())
	require.False(t, c.hit("e0", "h0"), "oldest evicted")
	require.False(t, c.hit("e1", "h1"), "second oldest evicted")
	for i := 2; i < 5; i++ {
		require.True(t, c.hit(fmt.Sprint("e", i), fmt.Sprint("h", i)))
	}
	require.False(t, c.hit("e4", "other"), "another hash is never a hit")
	c.add("e4", "h4") // already there: no growth, no eviction
	require.True(t, c.hit("e2", "h2"))
	require.Equal(t, DedupCacheStats{Capacity: 3, Entries: 3, Hits: 4}, c.stats())
	for i := range 1000 {
		c.add(fmt.Sprint("x", i), "h")
	}
	require.Equal(t, 3, c.stats().Entries, "never above the bound")
	require.True(t, c.hit("x999", "h"))
	require.False(t, c.hit("x996", "h"))
}

func TestDedupCacheDisabledAndDefaults(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, -1} {
		c := newDedupCache(n)
		require.Nil(t, c)
		c.add("e", "h")
		require.False(t, c.hit("e", "h"))
		require.Equal(t, DedupCacheStats{}, c.stats())
	}
	require.Equal(t, DefaultDedupCacheSize, ProcessorConfig{}.WithDefaults().DedupCacheSize)
	require.Equal(t, 7, ProcessorConfig{DedupCacheSize: 7}.WithDefaults().DedupCacheSize)
	require.Equal(t, -1, ProcessorConfig{DedupCacheSize: -1}.WithDefaults().DedupCacheSize)

	db, err := sqlx.Open("mysql", "u:p@tcp(127.0.0.1:1)/none") // never connected
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	routes := map[string]Route{"Created": {Handler: effectHandler}}
	p, err := NewProcessor(ProcessorConfig{Group: "g", DB: db, Routes: routes, DedupCacheSize: -1})
	require.NoError(t, err)
	require.Equal(t, DedupCacheStats{}, p.DedupCacheStats())
	p, err = NewProcessor(ProcessorConfig{Group: "g", DB: db, Routes: routes})
	require.NoError(t, err)
	require.Equal(t, DedupCacheStats{Capacity: DefaultDedupCacheSize}, p.DedupCacheStats())
}

// A cached duplicate touches no database: its pool is closed. A redelivery
// with another hash is not decided by the cache: it needs the database.
func TestDedupCacheHitSkipsDatabase(t *testing.T) {
	t.Parallel()
	eachDB(t, testDedupCacheHitSkipsDatabase)
}

func testDedupCacheHitSkipsDatabase(t *testing.T, db *sqlx.DB) {
	own := testenv.Reopen(t, db) // closed below, db stays open
	p := newProc(t, own, nil)
	ctx := context.Background()
	id := wire.NewEventID()

	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`)).Result)
	require.Equal(t, DedupCacheStats{Capacity: DefaultDedupCacheSize, Entries: 1}, p.DedupCacheStats())
	require.NoError(t, own.Close())

	for range 3 {
		o := p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`))
		require.Equal(t, ResultDuplicate, o.Result, "no database needed: %v", o.Err)
		require.True(t, o.Ack())
	}
	require.EqualValues(t, 3, p.DedupCacheStats().Hits)
	require.Equal(t, Stats{Applied: 1, Duplicates: 3}, p.Stats(), "cache hits count as dedup hits")

	o := p.Process(ctx, msg(ev(id, "Created"), `{"a":2}`))
	require.Equal(t, ResultRetry, o.Result, "a different hash goes to the (closed) database")
	require.False(t, o.Ack())
	require.EqualValues(t, 3, p.DedupCacheStats().Hits)
	require.Equal(t, 1, effects(t, db))
}

// A hash mismatch with a cached event is parked as a conflict by the
// database path, with both hashes; the cached entry stays valid.
func TestDedupCacheMismatchParksConflict(t *testing.T) {
	t.Parallel()
	eachDB(t, testDedupCacheMismatchParksConflict)
}

func testDedupCacheMismatchParksConflict(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, nil)
	ctx := context.Background()
	id := wire.NewEventID()

	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`)).Result)
	c := p.Process(ctx, msg(ev(id, "Created"), `{"a":2}`))
	require.Equal(t, ResultConflict, c.Result)
	require.ErrorIs(t, c.Err, ErrConflict)
	dl, err := p.DeadLetters().Get(ctx, c.DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, wire.Hash([]byte(`{"a":2}`)), dl.RequestHash)
	require.Equal(t, wire.Hash([]byte(`{"a":1}`)), dl.ExistingHash)
	require.Zero(t, p.DedupCacheStats().Hits)

	require.Equal(t, ResultDuplicate, p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`)).Result)
	require.EqualValues(t, 1, p.DedupCacheStats().Hits)
	require.Equal(t, Stats{Applied: 1, Duplicates: 1, Conflicts: 1, Parked: 1}, p.Stats())
	require.Equal(t, 1, effects(t, db))
}

// Only a commit fills the cache: a handler error, a failed commit and a
// strict-mode gap (all rolled back) leave nothing cached, and the next
// delivery runs the handler.
func TestDedupCacheNeverHoldsRolledBackAttempts(t *testing.T) {
	t.Parallel()
	eachDB(t, testDedupCacheNeverHoldsRolledBackAttempts)
}

func testDedupCacheNeverHoldsRolledBackAttempts(t *testing.T, db *sqlx.DB) {
	var mode atomic.Value // "fail", "rollback" or "ok"
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Routes["Created"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			if err := effectHandler(ctx, tx, ev); err != nil {
				return err
			}
			switch mode.Load() {
			case "fail":
				return Transient(errors.New("try later"))
			case "rollback":
				return tx.Rollback() // nil; the commit then fails
			}
			return nil
		}}
	})
	ctx := context.Background()
	id := wire.NewEventID()
	m := msg(ev(id, "Created"), `{"a":1}`)

	mode.Store("fail")
	require.Equal(t, ResultRetry, p.Process(ctx, m).Result)
	require.Zero(t, p.DedupCacheStats().Entries)
	mode.Store("rollback")
	o := p.Process(ctx, m)
	require.Equal(t, ResultRetry, o.Result)
	require.ErrorContains(t, o.Err, "commit")
	require.Zero(t, p.DedupCacheStats().Entries)
	require.Zero(t, effects(t, db))

	gap := aggEv(wire.NewEventID(), "box-1", 2) // strict: version 1 first
	require.Equal(t, ResultRetry, p.Process(ctx, msg(gap, `{}`)).Result)
	require.Zero(t, p.DedupCacheStats().Entries)

	mode.Store("ok")
	require.Equal(t, ResultApplied, p.Process(ctx, m).Result, "nothing was cached: the handler runs")
	require.Equal(t, DedupCacheStats{Capacity: DefaultDedupCacheSize, Entries: 1}, p.DedupCacheStats())
	require.Equal(t, ResultDuplicate, p.Process(ctx, m).Result)
	require.EqualValues(t, 1, p.DedupCacheStats().Hits)
	require.Equal(t, 1, effects(t, db))
}

// With a bound of 2, the third event evicts the first; its redelivery is
// still a dedup hit, from the database, and it is cached again.
func TestDedupCacheBoundInProcessor(t *testing.T) {
	t.Parallel()
	eachDB(t, testDedupCacheBoundInProcessor)
}

func testDedupCacheBoundInProcessor(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, func(c *ProcessorConfig) { c.DedupCacheSize = 2 })
	ctx := context.Background()
	ids := []string{wire.NewEventID(), wire.NewEventID(), wire.NewEventID()}
	for _, id := range ids {
		require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(id, "Created"), "p-"+id)).Result)
	}
	require.Equal(t, DedupCacheStats{Capacity: 2, Entries: 2}, p.DedupCacheStats())
	require.Equal(t, ResultDuplicate, p.Process(ctx, msg(ev(ids[0], "Created"), "p-"+ids[0])).Result)
	require.Equal(t, DedupCacheStats{Capacity: 2, Entries: 2}, p.DedupCacheStats(), "evicted: answered by the database")
	require.Equal(t, ResultDuplicate, p.Process(ctx, msg(ev(ids[0], "Created"), "p-"+ids[0])).Result)
	require.Equal(t, DedupCacheStats{Capacity: 2, Entries: 2, Hits: 1}, p.DedupCacheStats(), "cached again by the database hit")
	require.Equal(t, Stats{Applied: 3, Duplicates: 2}, p.Stats())
	require.Equal(t, 3, effects(t, db))
}

// The database path alone (cache disabled) under driver flags that change
// what a statement reports: clientFoundRows (rows matched, not changed) and
// interpolateParams (no server-side prepare). Duplicates, conflicts and
// stale versions are told apart the same way.
func TestDedupDatabasePathDriverFlags(t *testing.T) {
	t.Parallel()
	eachDB(t, testDedupDatabasePathDriverFlags)
}

func testDedupDatabasePathDriverFlags(t *testing.T, db *sqlx.DB) {
	// The driver settings that change what a statement reports or how it
	// is sent: MySQL's clientFoundRows (rows matched, not changed) and
	// interpolateParams (no server-side prepare); pgx's query exec modes
	// (prepared and cached, described each time, simple protocol).
	type variant struct {
		flags string
		open  func() *sqlx.DB
	}
	my := func(foundRows, interpolate bool) variant {
		return variant{fmt.Sprintf("clientFoundRows=%v interpolateParams=%v", foundRows, interpolate), func() *sqlx.DB {
			return testenv.MySQLVariant(t, db, func(c *mysql.Config) { c.ClientFoundRows, c.InterpolateParams = foundRows, interpolate })
		}}
	}
	pg := func(mode pgx.QueryExecMode) variant {
		return variant{"exec mode " + mode.String(), func() *sqlx.DB {
			return testenv.PGVariant(t, db, func(c *pgx.ConnConfig) { c.DefaultQueryExecMode = mode })
		}}
	}
	variants := []variant{my(false, false), my(true, false), my(true, true)}
	if db.DriverName() != "mysql" {
		variants = []variant{pg(pgx.QueryExecModeCacheStatement), pg(pgx.QueryExecModeDescribeExec), pg(pgx.QueryExecModeSimpleProtocol)}
	}
	for _, v := range variants {
		flags := v.flags
		own := v.open()
		p := newProc(t, own, func(c *ProcessorConfig) { c.DedupCacheSize = -1; c.VersionMode = VersionMonotonic })
		ctx := context.Background()
		id := wire.NewEventID()
		require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`)).Result, "%+v", flags)
		require.Equal(t, ResultDuplicate, p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`)).Result, "%+v", flags)
		c := p.Process(ctx, msg(ev(id, "Created"), `{"a":2}`))
		require.Equal(t, ResultConflict, c.Result, "%+v", flags)
		dl, err := p.DeadLetters().Get(ctx, c.DeadLetterID)
		require.NoError(t, err)
		require.Equal(t, wire.Hash([]byte(`{"a":1}`)), dl.ExistingHash, "%+v", flags)
		// Parked again: the same row, whose id the one upsert statement returns.
		c2 := p.Process(ctx, msg(ev(id, "Created"), `{"a":2}`))
		require.Equal(t, ResultConflict, c2.Result, "%+v", flags)
		require.Equal(t, c.DeadLetterID, c2.DeadLetterID, "%+v", flags)
		dl, err = p.DeadLetters().Get(ctx, c.DeadLetterID)
		require.NoError(t, err)
		require.Equal(t, 2, dl.ParkCount, "%+v", flags)

		agg := "box-" + id
		require.Equal(t, ResultApplied, p.Process(ctx, msg(aggEv(wire.NewEventID(), agg, 2), `{}`)).Result)
		staleID := wire.NewEventID()
		require.Equal(t, ResultStale, p.Process(ctx, msg(aggEv(staleID, agg, 1), `{}`)).Result)
		require.Equal(t, ResultDuplicate, p.Process(ctx, msg(aggEv(staleID, agg, 1), `{}`)).Result, "a stale skip is recorded: its redelivery is a dedup hit")

		require.Equal(t, Stats{Applied: 2, Duplicates: 2, Conflicts: 2, Parked: 2, Stale: 1}, p.Stats(), "%+v", flags)
		require.Zero(t, p.DedupCacheStats().Hits)
		var retries int
		require.NoError(t, db.Get(&retries, db.Rebind("SELECT retry_count FROM rmqtx_consume_log WHERE consumer_group = ? AND event_id = ?"), p.Config().Group, id))
		require.Zero(t, retries, "the duplicate's marker update was rolled back")
	}
	require.Equal(t, 6, effects(t, db))
}

func TestDupWindow(t *testing.T) {
	t.Parallel()
	var w dupWindow
	require.False(t, w.storm())
	for range stormDups - 1 {
		w.record(true)
	}
	require.False(t, w.storm())
	w.record(true)
	require.True(t, w.storm(), "%d duplicates of the last 64", stormDups)
	for range 64 - stormDups {
		w.record(false)
	}
	require.True(t, w.storm(), "the duplicates are still within the window")
	w.record(false)
	require.False(t, w.storm(), "one more first delivery ends it")
}

// In a duplicate storm (cache disabled, so the database answers) a
// duplicate is decided by a non-locking read of the committed row before any
// transaction: it is answered while another transaction holds the row's
// lock, which the transaction path would wait for. First deliveries and
// conflicts still take the transaction.
func TestDedupStormReadsCommittedRowFirst(t *testing.T) {
	t.Parallel()
	eachDB(t, testDedupStormReadsCommittedRowFirst)
}

func testDedupStormReadsCommittedRowFirst(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, func(c *ProcessorConfig) { c.DedupCacheSize = -1 })
	ctx := context.Background()
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = wire.NewEventID()
		require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(ids[i], "Created"), "p-"+ids[i])).Result)
	}
	require.False(t, p.dups.storm())
	for _, id := range ids {
		require.Equal(t, ResultDuplicate, p.Process(ctx, msg(ev(id, "Created"), "p-"+id)).Result)
	}
	require.True(t, p.dups.storm())

	lock, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback() }()
	var h string
	require.NoError(t, lock.Get(&h, lock.Rebind("SELECT request_hash FROM rmqtx_consume_log WHERE consumer_group = ? AND event_id = ? FOR UPDATE"), p.Config().Group, ids[0]))
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.Equal(t, ResultDuplicate, p.Process(dctx, msg(ev(ids[0], "Created"), "p-"+ids[0])).Result, "answered without the row lock")
	require.NoError(t, lock.Rollback())

	fresh := wire.NewEventID()
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(fresh, "Created"), "p-"+fresh)).Result, "a miss takes the transaction")
	c := p.Process(ctx, msg(ev(ids[1], "Created"), "other"))
	require.Equal(t, ResultConflict, c.Result, "another hash takes the transaction")
	dl, err := p.DeadLetters().Get(ctx, c.DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, wire.Hash([]byte("p-"+ids[1])), dl.ExistingHash)
	require.Equal(t, Stats{Applied: 65, Duplicates: 65, Conflicts: 1, Parked: 1}, p.Stats())
	require.Equal(t, 65, effects(t, db))
}
