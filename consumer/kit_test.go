package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/rmqtxtest"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/wire"
)

// The Processor's batch logic on the in-process broker of rmqtxtest:
// duplicates, conflicts and reordered versions in one pulled batch, and a
// failed handler's redelivery. The broker makes the batch: Hold keeps what
// is published invisible until Release appends it to the queue at once (in
// order or reversed), and DuplicateNext stores a message twice, as a
// redelivery does, instead of hoping the real broker pulls them together.
// The real-broker tests named on each test stay the proof of the same
// invariant against RocketMQ itself.

// kitBed is one kit test's world: the in-process broker, a topic of one
// queue (everything published forms one line of batches), a raw publisher
// and a database with the consumer tables and the business tables.
type kitBed struct {
	b     *rmqtxtest.Broker
	db    *sqlx.DB
	topic string
	pub   rocketmq.Producer
}

// kitEachDB runs body on a fresh kitBed on each database, the two as
// parallel subtests, and logs how long each took.
func kitEachDB(t *testing.T, body func(t *testing.T, k *kitBed)) {
	t.Helper()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		start := time.Now()
		k := &kitBed{b: rmqtxtest.NewBroker(t), db: db, topic: testenv.Name(t, "topic")}
		k.b.CreateTopic(k.topic, 1)
		kitTables(t, db)
		name := testenv.Name(t, "pub")
		p, err := rocketmq.NewProducer(
			producer.WithNsResolver(primitive.NewPassthroughResolver(k.b.NameServers())),
			producer.WithGroupName(name), producer.WithInstanceName(name), producer.WithRetry(0))
		require.NoError(t, err)
		require.NoError(t, p.Start())
		t.Cleanup(func() { _ = p.Shutdown() })
		k.pub = p
		body(t, k)
		t.Logf("%s: %s", t.Name(), time.Since(start).Round(time.Millisecond))
	})
}

// kitTables migrates db and adds "effect" (one row per committed handler
// run, no unique key: a duplicate effect would show) and "box" (the latest
// version the handler wrote per aggregate, unguarded).
func kitTables(t *testing.T, db *sqlx.DB) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	ddl := []string{`CREATE TABLE effect (
		id BIGINT AUTO_INCREMENT PRIMARY KEY,
		event_id VARCHAR(64) NOT NULL,
		agg_id VARCHAR(128) NOT NULL,
		version BIGINT NOT NULL,
		payload VARBINARY(1024) NOT NULL)`}
	if db.DriverName() != "mysql" {
		ddl = []string{`CREATE TABLE effect (
		id BIGSERIAL PRIMARY KEY,
		event_id VARCHAR(64) NOT NULL,
		agg_id VARCHAR(128) NOT NULL,
		version BIGINT NOT NULL,
		payload BYTEA NOT NULL)`}
	}
	ddl = append(ddl, "CREATE TABLE box (agg_id VARCHAR(128) PRIMARY KEY, version BIGINT NOT NULL)")
	for _, q := range ddl {
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}
}

// publish sends one message with the envelope of env and payload.
func (k *kitBed) publish(t *testing.T, env wire.Envelope, payload []byte) {
	t.Helper()
	m := primitive.NewMessage(k.topic, payload)
	m.WithProperties(env.Properties(payload))
	m.WithKeys([]string{env.EventID})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := k.pub.SendSync(ctx, m)
	require.NoError(t, err)
	require.Equal(t, primitive.SendOK, res.Status)
}

// consumer starts a kit consumer of k's topic with routes; mut adjusts the
// config first.
func (k *kitBed) consumer(t *testing.T, routes map[string]consumer.Route, mut func(*consumer.Config)) *consumer.Consumer {
	t.Helper()
	cfg := consumer.Config{DB: k.db, Topic: k.topic, Routes: routes}
	if mut != nil {
		mut(&cfg)
	}
	return rmqtxtest.NewConsumer(t, k.b, cfg)
}

func (k *kitBed) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, k.db.Get(&n, k.db.Rebind(q), args...))
	return n
}

// waitStats waits until the consumer's stats satisfy cond.
func waitStats(t *testing.T, c *consumer.Consumer, what string, cond func(consumer.Stats) bool) consumer.Stats {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, what, func() bool { return cond(c.Processor().Stats()) })
	return c.Processor().Stats()
}

func kitEffect(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
	_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO effect (event_id, agg_id, version, payload) VALUES (?, ?, ?, ?)"),
		ev.ID, ev.AggregateID, ev.AggregateVersion, ev.Payload)
	return err
}

// kitBox records the effect and overwrites the aggregate's version in box
// unconditionally: only the consumer's version guard keeps it from going
// backwards.
func kitBox(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
	if err := kitEffect(ctx, tx, ev); err != nil {
		return err
	}
	d, err := dialect.ForDriver(tx.DriverName())
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, d.Rebind(d.Upsert("box", "agg_id, version", "?, ?", "agg_id", "version = "+d.Excluded("version"))),
		ev.AggregateID, ev.AggregateVersion)
	return err
}

// kitModes are the consumer's ways of processing what one pull hands over:
// one message per callback (concurrently), several per callback each in its
// own transaction (in queue order), and several sharing one transaction
// (Processor.ProcessBatch).
var kitModes = []struct {
	name string
	set  func(*consumer.Config)
}{
	{"single", func(c *consumer.Config) { c.BatchSize = 1 }},
	{"batch", func(c *consumer.Config) { c.BatchSize = 8 }},
	{"batch-tx", func(c *consumer.Config) { c.BatchSize, c.BatchTransaction = 8, true }},
}

func moved(id, agg string, v int64) wire.Envelope {
	return wire.Envelope{EventID: id, EventType: "Moved", AggregateType: "Box", AggregateID: agg, AggregateVersion: v}
}

// One pulled batch holds an event, its copy published again, a broker
// duplicate of another (same UNIQ_KEY), and the first event's id with
// another payload: each event has one effect, each extra copy is a dedup
// hit or, when it differs from the applied payload, a parked conflict that
// shows both hashes. Handed over in queue order (batch, batch-tx), the
// first payload applies and the other is the one conflict; one message per
// callback runs concurrently, so either payload of the id may win there.
// Real-broker proof: TestDuplicateStorm and TestConflict.
func TestKitBatchDuplicatesAndConflict(t *testing.T) {
	t.Parallel()
	for _, mode := range kitModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			kitEachDB(t, func(t *testing.T, k *kitBed) {
				a, bID, c := wire.NewEventID(), wire.NewEventID(), wire.NewEventID()
				pa, pb, pc, pOther := []byte(`{"n":1}`), []byte(`{"n":2}`), []byte(`{"n":3}`), []byte(`{"n":999}`)
				created := func(id string) wire.Envelope { return wire.Envelope{EventID: id, EventType: "Created"} }
				k.b.Hold(k.topic)
				k.publish(t, created(a), pa)
				k.publish(t, created(a), pa) // published again: another message, same event
				k.b.DuplicateNext(k.topic)
				k.publish(t, created(bID), pb) // stored twice by the broker
				k.publish(t, created(a), pOther)
				k.publish(t, created(c), pc)
				k.b.Release(k.topic, false)
				require.Len(t, k.b.Messages(k.topic), 6)

				cons := k.consumer(t, map[string]consumer.Route{"Created": {Handler: kitEffect}}, func(cfg *consumer.Config) {
					mode.set(cfg)
					cfg.Redact = consumer.KeepPayload
				})
				s := waitStats(t, cons, "six messages processed", func(s consumer.Stats) bool {
					return s.Applied+s.Duplicates+s.Conflicts >= 6
				})
				require.EqualValues(t, 3, s.Applied)
				require.EqualValues(t, 3, s.Duplicates+s.Conflicts)
				require.Zero(t, s.Retries)
				require.Equal(t, 3, k.count(t, "SELECT COUNT(*) FROM effect"))
				require.Equal(t, 3, k.count(t, "SELECT COUNT(DISTINCT event_id) FROM effect"))
				var applied []byte
				require.NoError(t, k.db.Get(&applied, k.db.Rebind("SELECT payload FROM effect WHERE event_id = ?"), a))
				other := pOther
				if string(applied) == string(pOther) {
					other = pa
				}

				dls, err := cons.Processor().DeadLetters().List(context.Background(), consumer.DeadLetterFilter{ConsumerGroup: cons.Config().Group})
				require.NoError(t, err)
				// One dead letter per event id and payload: a second conflicting
				// copy (single mode, when the other payload won) parks it again.
				require.Len(t, dls, 1)
				require.EqualValues(t, s.Conflicts, s.Parked)
				dl := dls[0]
				require.EqualValues(t, s.Conflicts, dl.ParkCount)
				require.Equal(t, consumer.ClassConflict, dl.ErrorClass)
				require.Equal(t, a, dl.EventID)
				require.Equal(t, wire.Hash(other), dl.RequestHash)
				require.Equal(t, wire.Hash(applied), dl.ExistingHash)
				require.Equal(t, other, dl.Payload)
				if mode.name != "single" {
					require.Equal(t, pa, applied, "the first payload in queue order is the one applied")
					require.EqualValues(t, 2, s.Duplicates)
					require.EqualValues(t, 1, s.Conflicts)
				}
				t.Logf("%s: applied=%d dedup_hits=%d conflicts=%d parked=%d", mode.name, s.Applied, s.Duplicates, s.Conflicts, s.Parked)
			})
		})
	}
}

// Each aggregate's versions are stored newest first (Hold, then Release
// reversed) and pulled together. Monotonic: the box never goes backwards,
// every version is applied or a stale skip, and handed over in queue order
// (batch, batch-tx) only the newest applies. Strict: the versions wait for
// their predecessors and apply in version order, each effect once.
// Real-broker proof: TestOutOfOrderMonotonic, TestOutOfOrderStrict and
// TestOrderGapHoldsNothingBack.
func TestKitReorderedVersions(t *testing.T) {
	t.Parallel()
	for _, vm := range []struct {
		name string
		mode consumer.VersionMode
	}{{"monotonic", consumer.VersionMonotonic}, {"strict", consumer.VersionStrict}} {
		for _, mode := range kitModes {
			t.Run(vm.name+"/"+mode.name, func(t *testing.T) {
				t.Parallel()
				kitEachDB(t, func(t *testing.T, k *kitBed) {
					testReorderedVersions(t, k, vm.mode, mode.name, mode.set)
				})
			})
		}
	}
}

const kitAggs, kitVersions = 3, 5

// kitStrictMaxWaits is the MaxWaits of the kit tests whose versions wait
// for their predecessors (VersionStrict). The kit's broker redelivers a
// message sent back at once, so a version whose predecessor is still in
// another callback (behind other events of its batch, or not yet handed
// back by it) is redelivered every few milliseconds, and each redelivery
// is a wait. The default 20 waits last about 17 minutes on a real broker
// (delay levels 1 s, 5 s, 10 s, 30 s, then 1 min); here they lasted under
// 0.1 s, and a loaded machine that held the predecessor's goroutine that
// long parked the waiting versions for good
// (TestKitGapOutwaitsHeldPredecessor). With this bound a wait ends only
// when its predecessor applies or the test's own 30 s run out, as the
// real-broker TestOutOfOrderStrict raises MaxWaits for the same reason.
const kitStrictMaxWaits = 100_000

// publishReversed publishes versions 1..kitVersions of box-0..box-<kitAggs-1>
// and makes them visible newest first: per aggregate, box-2's versions 5
// to 1, then box-1's, then box-0's.
func publishReversed(t *testing.T, k *kitBed) {
	t.Helper()
	k.b.Hold(k.topic)
	for a := range kitAggs {
		for v := int64(1); v <= kitVersions; v++ {
			k.publish(t, moved(wire.NewEventID(), fmt.Sprintf("box-%d", a), v), []byte(fmt.Sprintf("v%d", v)))
		}
	}
	k.b.Release(k.topic, true)
	stored := k.b.Messages(k.topic)
	require.Len(t, stored, kitAggs*kitVersions)
	require.Equal(t, fmt.Sprint(kitVersions), stored[0].Properties[wire.PropAggregateVersion], "stored newest first")
}

func testReorderedVersions(t *testing.T, k *kitBed, vm consumer.VersionMode, mode string, set func(*consumer.Config)) {
	publishReversed(t, k)
	cons := k.consumer(t, map[string]consumer.Route{"Moved": {Handler: kitBox}}, func(cfg *consumer.Config) {
		set(cfg)
		cfg.VersionMode = vm
		if vm == consumer.VersionStrict {
			cfg.MaxWaits = kitStrictMaxWaits
		}
	})
	const total = kitAggs * kitVersions
	var s consumer.Stats
	if vm == consumer.VersionMonotonic {
		s = waitStats(t, cons, "every version applied or skipped", func(s consumer.Stats) bool { return s.Applied+s.Stale >= total })
		require.EqualValues(t, total, s.Applied+s.Stale)
		require.EqualValues(t, s.Applied, k.count(t, "SELECT COUNT(*) FROM effect"))
		if mode != "single" {
			require.EqualValues(t, kitAggs, s.Applied, "only the newest version of each applies")
		}
	} else {
		s = waitStats(t, cons, "every version applied", func(s consumer.Stats) bool { return s.Applied >= total })
		require.EqualValues(t, total, s.Applied)
		require.Positive(t, s.Gaps, "later versions waited for earlier ones")
		for a := range kitAggs {
			var got []int64
			require.NoError(t, k.db.Select(&got, k.db.Rebind("SELECT version FROM effect WHERE agg_id = ? ORDER BY id"), fmt.Sprintf("box-%d", a)))
			require.Equal(t, []int64{1, 2, 3, 4, 5}, got, "box-%d applied in version order", a)
		}
		require.Zero(t, k.count(t, "SELECT COUNT(*) FROM rmqtx_consume_attempt"), "waits cleared once applied")
	}
	require.Zero(t, s.Parked)
	require.Equal(t, kitAggs, k.count(t, "SELECT COUNT(*) FROM box WHERE version = ?", kitVersions), "every box ends at its newest version")
	t.Logf("%s: applied=%d stale=%d gap_waits=%d retries=%d", mode, s.Applied, s.Stale, s.Gaps, s.Retries)
}

// A version redelivered while its predecessor is held up in another
// callback waits as long as MaxWaits lets it, and in the kit a wait lasts
// a few milliseconds. The reversed queue is handed over in two batches of
// BatchSize 8: box-1's versions 5, 4 and 3 end the first, which hands them
// back at once; version 2 opens the second, which hands it back only when
// the whole batch is done. The handler holds that batch (at box-0's version
// 1, its last event) until box-1's versions 3 to 5 have waited more than 20
// times each, the default MaxWaits, as a stalled goroutine on a loaded
// machine did. With kitStrictMaxWaits they go on waiting and apply in
// version order once version 2 is handed back; with the default they were
// parked, and the one-off red TestKitReorderedVersions/strict/batch/postgres
// ("timed out after 30s waiting for every version applied") was this: its
// log showed box-1's versions 3 to 5 parked after 21 attempts each.
func TestKitGapOutwaitsHeldPredecessor(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		const defaultMaxWaits = 20
		publishReversed(t, k)
		var cons atomic.Pointer[consumer.Consumer]
		var outwaited atomic.Bool
		waited := func() bool {
			if c := cons.Load(); c != nil && c.Processor().Stats().Parked > 0 {
				return true // parked: holding the batch longer changes nothing
			}
			var n int
			err := k.db.Get(&n, k.db.Rebind("SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE attempts > ?"), defaultMaxWaits)
			if err == nil && n >= 3 {
				outwaited.Store(true)
				return true
			}
			return false
		}
		hold := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
			if ev.AggregateID == "box-0" && ev.AggregateVersion == 1 {
				testenv.Await(20*time.Second, waited)
			}
			return kitBox(ctx, tx, ev)
		}
		c := k.consumer(t, map[string]consumer.Route{"Moved": {Handler: hold}}, func(cfg *consumer.Config) {
			cfg.BatchSize = 8
			cfg.VersionMode = consumer.VersionStrict
			cfg.MaxWaits = kitStrictMaxWaits
		})
		cons.Store(c)
		const total = kitAggs * kitVersions
		s := waitStats(t, c, "every version applied or parked", func(s consumer.Stats) bool { return s.Applied+s.Parked >= total })
		require.Zero(t, s.Parked, "no version parked while its predecessor was held")
		require.True(t, outwaited.Load(), "three versions (box-1's 3 to 5) waited more than %d times each", defaultMaxWaits)
		require.EqualValues(t, total, s.Applied)
		for a := range kitAggs {
			var got []int64
			require.NoError(t, k.db.Select(&got, k.db.Rebind("SELECT version FROM effect WHERE agg_id = ? ORDER BY id"), fmt.Sprintf("box-%d", a)))
			require.Equal(t, []int64{1, 2, 3, 4, 5}, got, "box-%d applied in version order", a)
		}
		require.Zero(t, k.count(t, "SELECT COUNT(*) FROM rmqtx_consume_attempt"), "waits cleared once applied")
		t.Logf("applied=%d gap_waits=%d", s.Applied, s.Gaps)
	})
}

// A handler fails (transient) for one event of a batch of ten: no effect
// and no dedup row is left for it, it alone is redelivered (the kit's
// broker redelivers a sent-back message at once), the redelivery says it is
// the first retry and applies once; its siblings commit once (and run once,
// except in batch-tx, where the pass the failure rolled back ran them too).
// Real-broker proof: TestHandlerErrorRedelivered.
func TestKitHandlerErrorRedelivered(t *testing.T) {
	t.Parallel()
	for _, mode := range kitModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			kitEachDB(t, func(t *testing.T, k *kitBed) {
				target := wire.NewEventID()
				var mu sync.Mutex
				runs := map[string]int{}
				var retried consumer.Delivery
				routes := map[string]consumer.Route{"Created": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
					mu.Lock()
					runs[ev.ID]++
					n := runs[ev.ID]
					if ev.ID == target && n == 2 {
						retried = ev.Delivery
					}
					mu.Unlock()
					if err := kitEffect(ctx, tx, ev); err != nil {
						return err
					}
					if ev.ID == target && n == 1 {
						return consumer.Transient(fmt.Errorf("partner timeout")) // the effect rolls back with the tx
					}
					return nil
				}}}
				k.b.Hold(k.topic)
				var ids []string
				for i := range 10 {
					id := wire.NewEventID()
					if i == 3 {
						id = target
					}
					ids = append(ids, id)
					k.publish(t, wire.Envelope{EventID: id, EventType: "Created"}, []byte(fmt.Sprintf("p%d", i)))
				}
				k.b.Release(k.topic, false)
				cons := k.consumer(t, routes, mode.set)
				s := waitStats(t, cons, "all ten applied", func(s consumer.Stats) bool { return s.Applied >= 10 })
				require.EqualValues(t, 10, s.Applied)
				require.EqualValues(t, 1, s.Retries)
				require.Zero(t, s.Duplicates)
				mu.Lock()
				require.Equal(t, 2, runs[target], "failed once, then applied on its redelivery")
				for _, id := range ids {
					if id == target {
						continue
					}
					if mode.name == "batch-tx" {
						// The pass the failure rolled back ran them too; they
						// ran again, each in its savepoint, and committed once.
						require.Contains(t, []int{1, 2}, runs[id], "runs of %s", id)
					} else {
						require.Equal(t, 1, runs[id], "a sibling ran exactly once: %s", id)
					}
				}
				require.Equal(t, 1, retried.ReconsumeTimes, "the redelivery says it is the first retry")
				mu.Unlock()
				require.Equal(t, 10, k.count(t, "SELECT COUNT(*) FROM effect"))
				require.Equal(t, 10, k.count(t, "SELECT COUNT(DISTINCT event_id) FROM effect"), "one effect per event")
				require.Equal(t, 1, k.count(t, "SELECT retry_count FROM rmqtx_consume_log WHERE event_id = ?", target))
				require.Zero(t, k.count(t, "SELECT COUNT(*) FROM rmqtx_consume_attempt"))
				retries := k.b.Messages("%RETRY%" + cons.Config().Group)
				require.Len(t, retries, 1, "only the failed message went back")
				require.Equal(t, target, retries[0].Properties[wire.PropEventID])
				t.Logf("%s: applied=%d retries=%d", mode.name, s.Applied, s.Retries)
			})
		})
	}
}
