package txproducer_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := sqlx.NewDb(nil, "mysql")
	ok := txproducer.Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", DB: db}
	_, err := txproducer.New(ok)
	require.NoError(t, err)
	for name, mod := range map[string]func(*txproducer.Config){
		"no name server":  func(c *txproducer.Config) { c.NameServers = nil },
		"bad name server": func(c *txproducer.Config) { c.NameServers = []string{"nope"} },
		"no group":        func(c *txproducer.Config) { c.Group = "" },
		"bad group":       func(c *txproducer.Config) { c.Group = "a b" },
		"no db":           func(c *txproducer.Config) { c.DB = nil },
		"bad prefix":      func(c *txproducer.Config) { c.TablePrefix = "x;" },
		"huge payload":    func(c *txproducer.Config) { c.MaxPayloadBytes = 5 << 20 },
		"bad warm-up":     func(c *txproducer.Config) { c.WarmupTopics = []string{"a b"} },
	} {
		c := ok
		mod(&c)
		_, err := txproducer.New(c)
		require.ErrorIs(t, err, txproducer.ErrConfig, name)
	}
	d := ok.WithDefaults()
	require.True(t, strings.HasPrefix(d.InstanceName, "g-"))
	require.NotEqual(t, d.InstanceName, ok.WithDefaults().InstanceName, "instance names are unique per lifecycle")
	require.Equal(t, txproducer.DefaultFenceAge, d.FenceAge)
}

func TestSendBeforeStartAndAfterShutdown(t *testing.T) {
	t.Parallel()
	p, err := txproducer.New(txproducer.Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", DB: sqlx.NewDb(nil, "mysql")})
	require.NoError(t, err)
	_, err = p.Send(context.Background(), txproducer.Message{}, nil)
	require.ErrorIs(t, err, txproducer.ErrNotStarted)
	require.NoError(t, p.Shutdown(context.Background()))
	require.NoError(t, p.Shutdown(context.Background()), "Shutdown is idempotent")
	require.NoError(t, p.Close())
	_, err = p.Send(context.Background(), txproducer.Message{}, nil)
	require.ErrorIs(t, err, txproducer.ErrClosed)
	require.ErrorIs(t, p.Start(context.Background()), txproducer.ErrClosed)
}

// Invalid and oversized messages are rejected before anything is sent: the
// function never runs and no txlog row or consumable message appears.
// On both databases: no txlog row on either.
func TestInvalidMessagesRejectedBeforeSending(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		cfg := b.config()
		cfg.MaxPayloadBytes = 1024
		p := startProducer(t, cfg)
		ran := false
		fn := func(context.Context, *sqlx.Tx) error { ran = true; return nil }
		cases := map[string]func(*txproducer.Message){
			"empty topic":    func(m *txproducer.Message) { m.Topic = "" },
			"system topic":   func(m *txproducer.Message) { m.Topic = "RMQ_SYS_TRANS_HALF_TOPIC" },
			"no event type":  func(m *txproducer.Message) { m.EventType = "" },
			"long event id":  func(m *txproducer.Message) { m.EventID = strings.Repeat("x", 65) },
			"control char":   func(m *txproducer.Message) { m.BusinessKey = "a\x01b" },
			"key with space": func(m *txproducer.Message) { m.Keys = []string{"a b"} },
			"empty payload":  func(m *txproducer.Message) { m.Payload = nil },
			"half aggregate": func(m *txproducer.Message) { m.AggregateType = "Order" },
			"huge headers":   func(m *txproducer.Message) { m.Headers = map[string]string{"h": strings.Repeat("v", 4097)} },
		}
		for name, mod := range cases {
			m := b.msg("")
			mod(&m)
			res, err := p.Send(context.Background(), m, fn)
			require.ErrorIs(t, err, txproducer.ErrInvalidMessage, name)
			require.False(t, txproducer.IsRetryable(err), name)
			require.Equal(t, txproducer.StateNotSent, res.State, name)
		}
		big := b.msg("")
		big.Payload = make([]byte, 1025)
		_, err := p.Send(context.Background(), big, fn)
		require.ErrorIs(t, err, txproducer.ErrPayloadTooLarge)
		require.ErrorIs(t, err, txproducer.ErrInvalidMessage)
		_, err = p.Send(context.Background(), b.msg(""), nil)
		require.ErrorIs(t, err, txproducer.ErrInvalidMessage)
		require.False(t, ran, "the local function must not run for a rejected message")
		n, err := b.store.Count(context.Background(), txlog.Filter{})
		require.NoError(t, err)
		require.Zero(t, n)
		b.sendMarker(t, p)
		require.Equal(t, 1, b.coll.Snapshot().Distinct(), "only the marker was consumed")
	})
}

// a. 1000 commits are all consumed: exactly 1000 distinct ids, 1000 txlog
// rows, 1000 business rows; no ghosts, none lost.
func TestCommits(t *testing.T) {
	t.Parallel()
	eachDB(t, 4, testCommits)
}

func testCommits(t *testing.T, b *bundle) {
	const total, workers = 1000, 24
	cfg := b.config()
	cfg.DisableRecovery = false // exercise the default wiring too
	cfg.RecoveryStartRetry = time.Second
	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	cfg.Metrics = m
	p := startProducer(t, cfg)

	var mu sync.Mutex
	committed := map[string]bool{}
	var failed atomic.Int64
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				m := b.msg("")
				m.BusinessKey = "order-" + testenv.RandSuffix(16)
				m.Payload = []byte(`{"n":1}`)
				var id string
				res, err := p.Send(context.Background(), m, func(ctx context.Context, tx *sqlx.Tx) error {
					return insertOrder(m.BusinessKey)(ctx, tx)
				})
				id = res.EventID
				if err != nil || res.State != txproducer.StateCommitted {
					failed.Add(1)
					t.Errorf("send %s: %v (%s)", id, err, res.State)
					continue
				}
				mu.Lock()
				committed[id] = true
				mu.Unlock()
			}
		}()
	}
	for i := 0; i < total; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	sendTime := time.Since(start)
	require.Zero(t, failed.Load())
	require.Len(t, committed, total)

	snap := b.coll.WaitDistinct(t, total, 90*time.Second)
	ghosts, lost := 0, 0
	for id := range snap.Counts {
		if !committed[id] {
			ghosts++
		}
	}
	for id := range committed {
		if snap.Counts[id] == 0 {
			lost++
		}
	}
	ctx := context.Background()
	rows, err := b.store.Count(ctx, txlog.Filter{State: txlog.StateCommitted, ResolvedBy: txlog.ByLocalCommit})
	require.NoError(t, err)
	var orders int
	require.NoError(t, b.db.Get(&orders, "SELECT COUNT(*) FROM orders"))
	t.Logf("commits: sent=%d committed=%d consumed_distinct=%d deliveries=%d ghosts=%d lost=%d txlog_committed=%d orders=%d send_time=%s workers=%d",
		total, len(committed), snap.Distinct(), snap.Total, ghosts, lost, rows, orders, sendTime.Round(time.Millisecond), workers)
	require.Equal(t, total, snap.Distinct())
	require.Zero(t, ghosts)
	require.Zero(t, lost)
	require.Equal(t, total, rows)
	require.Equal(t, total, orders)
	require.EqualValues(t, total, testutil.ToFloat64(m.ProducerSends.WithLabelValues(b.group, "OrderPlaced", "committed")))
	// Every delivered message carries the envelope.
	msg := b.coll.Message(func() string {
		for id := range committed {
			return id
		}
		return ""
	}())
	env, err := wire.Decode(msg.GetProperties())
	require.NoError(t, err)
	require.Equal(t, "OrderPlaced", env.EventType)
	require.Contains(t, msg.GetKeys(), env.EventID, "the event id is in Keys")
}

// b. A local function that returns an error is never consumed, even after
// several check intervals; no COMMITTED row exists for it.
func TestRollbacks(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testRollbacks)
}

func testRollbacks(t *testing.T, b *bundle) {
	cfg := b.config()
	cfg.FenceAge = time.Hour // the sentinel below must stay unfenced
	// An hour does not fit the test broker's checks: Start refuses it
	// without recovery (BrokerSettingsError), and warns with it.
	cfg.DisableRecovery, cfg.RecoveryStartRetry = false, time.Second
	p := startProducer(t, cfg)
	ctx := context.Background()

	var rolledBack []string
	for i := 0; i < 20; i++ {
		m := b.msg("")
		res, err := p.Send(ctx, m, func(ctx context.Context, tx *sqlx.Tx) error {
			if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (id, amount) VALUES (?, 1)"), m.BusinessKey+testenv.RandSuffix(4)); err != nil {
				return err
			}
			return errBusiness
		})
		require.ErrorIs(t, err, errBusiness)
		require.ErrorIs(t, err, txproducer.ErrLocalTx)
		require.False(t, txproducer.IsRetryable(err))
		require.Equal(t, txproducer.StateRolledBack, res.State)
		row := b.row(t, res.EventID)
		require.Equal(t, txlog.StateRolledBack, row.State)
		require.Equal(t, txlog.ByLocalRollback, row.ResolvedBy)
		rolledBack = append(rolledBack, res.EventID)
	}

	// A sentinel transaction, started after the rollbacks, stays open until
	// the broker has checked it three times: three check scans have run.
	sentinel := "sentinel-" + testenv.RandSuffix(8)
	res, err := p.Send(ctx, b.msg(sentinel), func(ctx context.Context, tx *sqlx.Tx) error {
		if err := b.rec.wait(ctx, sentinel, func(as []checkback.Answer) bool { return len(as) >= 3 }); err != nil {
			return err
		}
		return insertOrder(sentinel)(ctx, tx)
	})
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	for _, a := range b.rec.get(sentinel) {
		require.Equal(t, checkback.Unknown, a.Decision, "an in-flight transaction is UNKNOWN while young")
		require.Equal(t, checkback.ReasonYoung, a.Reason)
	}
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[sentinel] > 0 }))

	snap := b.coll.Snapshot()
	checked := 0
	for _, id := range rolledBack {
		require.Zero(t, snap.Counts[id], "rolled-back event %s was consumed", id)
		// END_TRANSACTION is one-way and the broker may still check (its
		// op records lag): any check must answer ROLLBACK from the row.
		for _, a := range b.rec.get(id) {
			require.Equal(t, checkback.Rollback, a.Decision, "%+v", a)
			checked++
		}
	}
	n, err := b.store.Count(ctx, txlog.Filter{State: txlog.StateCommitted})
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the sentinel committed")
	var orders int
	require.NoError(t, b.db.Get(&orders, "SELECT COUNT(*) FROM orders"))
	require.Equal(t, 1, orders)
	t.Logf("rollbacks: rolled_back=%d consumed_of_them=0 checks_of_them=%d (all ROLLBACK) sentinel_checks=%d", len(rolledBack), checked, len(b.rec.get(sentinel)))
}

// fenceBlocked reports whether a check's fence (the insert that skips an
// existing row) is waiting on the row lock in b's database.
func fenceBlocked(b *bundle) bool {
	prefix := "INSERT IGNORE INTO " + b.store.Table()
	if b.db.DriverName() != "mysql" {
		prefix = "INSERT INTO " + b.store.Table() // LockWaiters counts only statements waiting for a lock
	}
	n, err := testenv.LockWaiters(b.db, prefix)
	return err == nil && n > 0
}

// e. A local transaction still running past the fence age: the check waits
// on the row lock and the broker's outcome equals the local outcome. Past
// the fence age no answer is UNKNOWN. A local transaction that loses to the
// fence rolls back cleanly.
func TestLongLocalTransaction(t *testing.T) {
	t.Parallel()
	t.Run("commit wins", func(t *testing.T) {
		t.Parallel()
		eachDB(t, 1, func(t *testing.T, b *bundle) {
			p := startProducer(t, b.config())
			id := "long-commit-" + testenv.RandSuffix(6)
			res, err := p.Send(context.Background(), b.msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
				if err := insertOrder(id)(ctx, tx); err != nil {
					return err
				}
				testenv.Eventually(t, 60*time.Second, "a check blocked on our row lock", func() bool { return fenceBlocked(b) })
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, txproducer.StateCommitted, res.State)
			as := b.rec.waitT(t, id, "the blocked check answers", func(as []checkback.Answer) bool {
				return len(as) > 0 && as[len(as)-1].Age >= testFenceAge
			})
			noUnknownPastFenceAge(t, as)
			last := as[len(as)-1]
			require.Equal(t, checkback.Commit, last.Decision, "%+v", as)
			require.Equal(t, txlog.ByLocalCommit, b.row(t, id).ResolvedBy)
			require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }))
			t.Logf("commit wins: answers=%d last=%s after %s", len(as), last.Decision, last.Age.Round(time.Millisecond))
		})
	})
	t.Run("rollback wins", func(t *testing.T) {
		t.Parallel()
		eachDB(t, 1, func(t *testing.T, b *bundle) {
			p := startProducer(t, b.config())
			id := "long-rollback-" + testenv.RandSuffix(6)
			res, err := p.Send(context.Background(), b.msg(id), func(ctx context.Context, tx *sqlx.Tx) error {
				testenv.Eventually(t, 60*time.Second, "a check blocked on our row lock", func() bool { return fenceBlocked(b) })
				return errBusiness
			})
			require.ErrorIs(t, err, errBusiness)
			require.Equal(t, txproducer.StateRolledBack, res.State)
			as := b.rec.waitT(t, id, "the blocked check answers ROLLBACK", hasDecision(checkback.Rollback))
			noUnknownPastFenceAge(t, as)
			require.Equal(t, txlog.StateRolledBack, b.row(t, id).State)
			b.sendMarker(t, p)
			require.Zero(t, b.coll.Snapshot().Counts[id])
		})
	})
	t.Run("fence wins", func(t *testing.T) {
		t.Parallel()
		eachDB(t, 1, func(t *testing.T, b *bundle) {
			cfg := b.config()
			id := "late-" + testenv.RandSuffix(6)
			cfg.Test.BeforeLocalTx = func(ctx context.Context, eventID string) {
				if eventID == id {
					b.waitRow(t, id, txlog.StateRolledBack)
				}
			}
			p := startProducer(t, cfg)
			ran := false
			res, err := p.Send(context.Background(), b.msg(id), func(context.Context, *sqlx.Tx) error { ran = true; return nil })
			require.ErrorIs(t, err, txproducer.ErrFenced)
			require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err), "a new Send may take the id over")
			require.Equal(t, txproducer.StateRolledBack, res.State)
			require.False(t, ran, "the function must not run once fenced")
			require.Equal(t, txlog.ByFence, b.row(t, id).ResolvedBy)
			as := b.rec.waitT(t, id, "ROLLBACK answered", hasDecision(checkback.Rollback))
			noUnknownPastFenceAge(t, as)
			b.sendMarker(t, p)
			require.Zero(t, b.coll.Snapshot().Counts[id])
			// A retry of the fenced id is a new half: it takes the id over
			// and commits it, once; the fenced half stays rolled back.
			res, err = p.Send(context.Background(), b.msg(id), insertOrder(id))
			require.NoError(t, err)
			require.Equal(t, txproducer.StateCommitted, res.State)
			require.False(t, res.Duplicate)
			b.exactlyOneCopy(t, p, id)
		})
	})
}

// f. A panic in the local function rolls back and returns an error; a panic
// in a check's resolver is answered UNKNOWN; later sends and checks work.
func TestPanics(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testPanics)
}

func testPanics(t *testing.T, b *bundle) {
	cfg := b.config()
	resolverPanics := "resolver-panics-" + testenv.RandSuffix(6)
	cfg.Resolver = checkback.ResolverFunc(func(_ context.Context, q checkback.Query) (checkback.Decision, error) {
		if q.EventID == resolverPanics {
			panic("resolver bug")
		}
		return checkback.Unknown, nil
	})
	cfg.FenceAge = time.Hour
	cfg.DisableRecovery, cfg.RecoveryStartRetry = false, time.Second // see TestRollbacks
	p := startProducer(t, cfg)
	ctx := context.Background()

	res, err := p.Send(ctx, b.msg(""), func(context.Context, *sqlx.Tx) error { panic("handler bug") })
	var pe *txproducer.PanicError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "handler bug", pe.Value)
	require.ErrorIs(t, err, txproducer.ErrLocalTx)
	require.Equal(t, txproducer.StateRolledBack, res.State)
	panicked := res.EventID
	require.Equal(t, txlog.StateRolledBack, b.row(t, panicked).State)

	// The check for this one runs while its transaction is open; the
	// resolver panics; the answer is UNKNOWN and the loop goes on.
	res, err = p.Send(ctx, b.msg(resolverPanics), func(ctx context.Context, tx *sqlx.Tx) error {
		if err := b.rec.wait(ctx, resolverPanics, func(as []checkback.Answer) bool {
			return len(as) > 0 && as[0].Reason == checkback.ReasonPanic
		}); err != nil {
			return err
		}
		return insertOrder(resolverPanics)(ctx, tx)
	})
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.Equal(t, checkback.Unknown, b.rec.get(resolverPanics)[0].Decision)

	// Later checks are still answered.
	after := "after-" + testenv.RandSuffix(6)
	res, err = p.Send(ctx, b.msg(after), func(ctx context.Context, tx *sqlx.Tx) error {
		if err := b.rec.wait(ctx, after, func(as []checkback.Answer) bool { return len(as) > 0 }); err != nil {
			return err
		}
		return insertOrder(after)(ctx, tx)
	})
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool {
		return s.Counts[resolverPanics] > 0 && s.Counts[after] > 0
	}))
	require.Zero(t, b.coll.Snapshot().Counts[panicked])
}

// h. Database down during Send: a clear, retryable error and no ghost
// event, both when the database is down at BEGIN and when it drops while
// the transaction is committing.
func TestDatabaseDown(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testDatabaseDown)
}

func testDatabaseDown(t *testing.T, b *bundle) {
	px := newProxy(t, testenv.ServerAddr(t, b.db))
	cfg := b.config()
	cfg.DB = testenv.PoolVia(t, b.db, px.addr)
	cfg.CheckTimeout = 3 * time.Second
	p := startProducer(t, cfg)
	ctx := context.Background()

	// 1. Down before BEGIN.
	px.down()
	res, err := p.Send(ctx, b.msg(""), insertOrder("x1"))
	require.ErrorIs(t, err, txproducer.ErrDatabase)
	require.True(t, txproducer.IsRetryable(err))
	require.Equal(t, txproducer.StateRolledBack, res.State)
	downAtBegin := res.EventID

	// 2. Drops inside the transaction, before COMMIT.
	px.up(t)
	dropped := "dropped-" + testenv.RandSuffix(6)
	res, err = p.Send(ctx, b.msg(dropped), func(ctx context.Context, tx *sqlx.Tx) error {
		if err := insertOrder(dropped)(ctx, tx); err != nil {
			return err
		}
		px.down()
		return nil
	})
	require.Error(t, err)
	require.True(t, txproducer.IsRetryable(err), "%v", err)
	require.NotEqual(t, txproducer.StateCommitted, res.State)
	t.Logf("dropped connection: state=%s err=%v", res.State, err)

	// The database comes back; the checks fence both.
	px.up(t)
	for _, id := range []string{downAtBegin, dropped} {
		row := b.waitRow(t, id, txlog.StateRolledBack)
		require.Contains(t, []txlog.ResolvedBy{txlog.ByFence, txlog.ByLocalRollback}, row.ResolvedBy)
		as := b.rec.waitT(t, id, "ROLLBACK answered", hasDecision(checkback.Rollback))
		for _, a := range as {
			if a.Age >= testFenceAge && a.Reason != checkback.ReasonError {
				require.NotEqual(t, checkback.Unknown, a.Decision, "%+v", a)
			}
		}
	}
	b.sendMarker(t, p)
	snap := b.coll.Snapshot()
	require.Zero(t, snap.Counts[downAtBegin], "ghost event")
	require.Zero(t, snap.Counts[dropped], "ghost event")
	var orders int
	require.NoError(t, b.db.Get(&orders, b.db.Rebind("SELECT COUNT(*) FROM orders WHERE id IN ('x1', ?)"), dropped))
	require.Zero(t, orders)
	// A retry with the same id commits it, once: the failed attempt did not
	// spend the id, and its half stays rolled back.
	res, err = p.Send(ctx, b.msg(dropped), insertOrder(dropped))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.False(t, res.Duplicate)
	b.exactlyOneCopy(t, p, dropped)
}

func checkLoops() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "checkTransactionState")
}

// Shutdown leaves no check goroutine behind (not parallel: it counts
// goroutines process-wide; parallel tests start after it).
func TestShutdownStopsCheckLoop(t *testing.T) {
	b := setup(t, 1)
	before := checkLoops()
	p, err := txproducer.New(b.config())
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	require.Greater(t, checkLoops(), before)
	res, err := p.Send(context.Background(), b.msg(""), insertOrder("leak"))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.NoError(t, p.Shutdown(context.Background()))
	testenv.Eventually(t, 10*time.Second, "check goroutine gone", func() bool { return checkLoops() == before })
	_, err = p.Send(context.Background(), b.msg(""), insertOrder("leak2"))
	require.True(t, errors.Is(err, txproducer.ErrClosed))
}
