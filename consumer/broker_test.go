package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// publisher is a raw normal producer (own group, own instance name) that
// sends messages carrying rmqtx envelope properties, as txproducer would.
type publisher struct {
	t *testing.T
	p rocketmq.Producer
}

func newPublisher(t *testing.T) *publisher {
	t.Helper()
	return &publisher{t: t, p: testenv.Producer(t)}
}

func (pb *publisher) send(topic string, env wire.Envelope, payload []byte) {
	pb.t.Helper()
	m := primitive.NewMessage(topic, payload)
	m.WithProperties(env.Properties(payload))
	m.WithKeys([]string{env.EventID})
	pb.sendRaw(m)
}

func (pb *publisher) sendRaw(m *primitive.Message) {
	pb.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := pb.p.SendSync(ctx, m)
	require.NoError(pb.t, err)
	require.Equal(pb.t, primitive.SendOK, res.Status)
}

// startConsumer starts a Consumer on topic and shuts it down at cleanup.
// Retries use delay level 1 (1s) so tests stay fast.
func startConsumer(t *testing.T, db *sqlx.DB, topic, group string, routes map[string]Route, mut func(c *Config)) *Consumer {
	t.Helper()
	s := testenv.Integration(t)
	cfg := Config{
		Group: group, DB: db, Routes: routes,
		DelayLevel:  func(Class, int) int { return 1 },
		NameServers: []string{s.NameServer},
		Topic:       topic,
	}
	if mut != nil {
		mut(&cfg)
	}
	c, err := New(cfg)
	require.NoError(t, err)
	startBuilt(t, c)
	return c
}

func startBuilt(t *testing.T, c *Consumer) {
	t.Helper()
	require.NoError(t, c.Start(context.Background()))
	require.NoError(t, c.Start(context.Background()), "Start is idempotent")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, c.Shutdown(ctx))
		require.NoError(t, c.Close(), "Close after Shutdown is a no-op")
	})
}

func sumStats(cs ...*Consumer) Stats {
	var s Stats
	for _, c := range cs {
		x := c.Processor().Stats()
		s.Applied += x.Applied
		s.Duplicates += x.Duplicates
		s.Conflicts += x.Conflicts
		s.Stale += x.Stale
		s.Gaps += x.Gaps
		s.Retries += x.Retries
		s.Parked += x.Parked
		s.Ignored += x.Ignored
	}
	return s
}

// runCounter counts handler runs per event id.
type runCounter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (r *runCounter) add(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runs == nil {
		r.runs = map[string]int{}
	}
	r.runs[id]++
	return r.runs[id]
}

func (r *runCounter) get(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs[id]
}

// a. Duplicate storm: 500 events, each published 3-5 times with the same id
// and payload, two consumer instances of one group: exactly 500 effects.
func TestDuplicateStorm(t *testing.T) {
	t.Parallel()
	eachDB(t, testDuplicateStorm)
}

func testDuplicateStorm(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 4)
	routes := map[string]Route{"Created": {Handler: effectHandler}}
	c1 := startConsumer(t, db, topic, group, routes, nil)
	c2 := startConsumer(t, db, topic, group, routes, nil)
	require.NotEqual(t, c1.Config().InstanceName, c2.Config().InstanceName)

	const events = 500
	type copyOf struct {
		env     wire.Envelope
		payload []byte
	}
	var sends []copyOf
	for i := range events {
		e := ev(wire.NewEventID(), "Created")
		payload := []byte(fmt.Sprintf(`{"n":%d}`, i))
		for range 3 + rand.IntN(3) {
			sends = append(sends, copyOf{e, payload})
		}
	}
	// Copies of one event go out back to back from different goroutines, so
	// they land on different queues and reach both instances at once.
	pb := newPublisher(t)
	work := make(chan copyOf)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for s := range work {
				pb.send(topic, s.env, s.payload)
			}
		})
	}
	for _, s := range sends {
		work <- s
	}
	close(work)
	wg.Wait()

	total := int64(len(sends))
	// Wait for the business truth, not only for the copy count: a copy the
	// broker delivers twice (a rebalance between the two instances) counts
	// as one more dedup hit, so the copies can add up while one event's
	// first apply is still being retried (a lost deadlock, say). A lost
	// event never reaches the effect count and fails here with the figures.
	// The Applied count is waited for too: a processor counts an apply just
	// after its COMMIT returns, so the last effect can be visible in the
	// table a moment before its count.
	testenv.Eventually(t, 90*time.Second, "every copy consumed and every event applied", func() bool {
		s := sumStats(c1, c2)
		return s.Applied+s.Duplicates >= total && s.Applied >= events && effects(t, db) >= events
	})
	s := sumStats(c1, c2)
	require.Equal(t, events, effects(t, db), "exactly one business effect per event")
	require.Equal(t, events, countRows(t, db, "SELECT COUNT(DISTINCT event_id) FROM effect"))
	require.EqualValues(t, events, s.Applied)
	require.GreaterOrEqual(t, s.Duplicates, total-events, "every extra copy is a dedup hit")
	require.Zero(t, s.Conflicts+s.Parked)
	require.Equal(t, events, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE consumer_group = ?", group))
	t.Logf("COUNTS a (duplicate storm): events=%d published=%d effects=%d applied=%d dedup_hits=%d (instance1 applied=%d dups=%d, instance2 applied=%d dups=%d) conflicts=%d parked=%d",
		events, total, effects(t, db), s.Applied, s.Duplicates,
		c1.Processor().Stats().Applied, c1.Processor().Stats().Duplicates,
		c2.Processor().Stats().Applied, c2.Processor().Stats().Duplicates, s.Conflicts, s.Parked)
}

// b. Conflict: the same id with a different payload gives one effect and one
// parked conflict that shows both hashes.
func TestConflict(t *testing.T) {
	t.Parallel()
	eachDB(t, testConflict)
}

func testConflict(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 2)
	c := startConsumer(t, db, topic, group, map[string]Route{"Created": {Handler: effectHandler}},
		func(c *Config) { c.Redact = KeepPayload }) // the dead letter keeps the payload to show
	pb := newPublisher(t)
	id := wire.NewEventID()
	a, b := []byte(`{"amount":100}`), []byte(`{"amount":999}`)
	pb.send(topic, ev(id, "Created"), a)
	testenv.Eventually(t, 60*time.Second, "first payload applied", func() bool { return c.Processor().Stats().Applied == 1 })
	pb.send(topic, ev(id, "Created"), b)
	pb.send(topic, ev(id, "Created"), a)
	testenv.Eventually(t, 60*time.Second, "conflict parked and duplicate absorbed", func() bool {
		s := c.Processor().Stats()
		return s.Conflicts == 1 && s.Duplicates == 1
	})
	require.Equal(t, 1, effects(t, db))
	var payload []byte
	require.NoError(t, db.Get(&payload, "SELECT payload FROM effect"))
	require.Equal(t, a, payload, "the applied payload is the first one")
	dls, err := c.Processor().DeadLetters().List(context.Background(), DeadLetterFilter{ConsumerGroup: group})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	dl := dls[0]
	require.Equal(t, ClassConflict, dl.ErrorClass)
	require.Equal(t, id, dl.EventID)
	require.Equal(t, wire.Hash(b), dl.RequestHash)
	require.Equal(t, wire.Hash(a), dl.ExistingHash)
	require.Equal(t, b, dl.Payload)
	require.Equal(t, topic, dl.Topic)
	require.NotEmpty(t, dl.MsgID)
	s := c.Processor().Stats()
	t.Logf("COUNTS b (conflict): effects=%d applied=%d dedup_hits=%d conflicts=%d parked=%d dead_letter=%d request_hash=%s existing_hash=%s",
		effects(t, db), s.Applied, s.Duplicates, s.Conflicts, s.Parked, dl.ID, dl.RequestHash, dl.ExistingHash)
}

// boxHandler overwrites the box's version unconditionally: only the version
// guard keeps it from going backwards.
func boxHandler(ctx context.Context, tx *sqlx.Tx, ev Event) error {
	if err := effectHandler(ctx, tx, ev); err != nil {
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

func createBox(t *testing.T, db *sqlx.DB) {
	_, err := db.Exec("CREATE TABLE box (agg_id VARCHAR(128) PRIMARY KEY, version BIGINT NOT NULL)")
	require.NoError(t, err)
}

// c. Out of order: each aggregate's versions are shuffled.
func TestOutOfOrderMonotonic(t *testing.T) {
	t.Parallel()
	eachDB(t, testOutOfOrderMonotonic)
}

func testOutOfOrderMonotonic(t *testing.T, db *sqlx.DB) {
	createBox(t, db)
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 4)
	const aggs, versions = 20, 6
	var sends []wire.Envelope
	for a := range aggs {
		for v := 1; v <= versions; v++ {
			sends = append(sends, aggEv(wire.NewEventID(), fmt.Sprintf("box-%d", a), int64(v)))
		}
	}
	rand.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })
	pb := newPublisher(t)
	for _, e := range sends {
		pb.send(topic, e, []byte(fmt.Sprintf("v%d", e.AggregateVersion)))
	}
	c := startConsumer(t, db, topic, group, map[string]Route{"Moved": {Handler: boxHandler}},
		func(c *Config) { c.VersionMode = VersionMonotonic })
	testenv.Eventually(t, 60*time.Second, "every event applied or skipped", func() bool {
		s := c.Processor().Stats()
		return s.Applied+s.Stale >= aggs*versions
	})
	// Late arrivals: one old version per aggregate, with new ids.
	for a := range aggs {
		pb.send(topic, aggEv(wire.NewEventID(), fmt.Sprintf("box-%d", a), 2), []byte("late"))
	}
	testenv.Eventually(t, 60*time.Second, "late arrivals skipped", func() bool {
		s := c.Processor().Stats()
		return s.Applied+s.Stale >= aggs*versions+aggs
	})
	s := c.Processor().Stats()
	require.Equal(t, aggs, countRows(t, db, "SELECT COUNT(*) FROM box WHERE version = ?", versions), "every aggregate ends at its highest version")
	require.Equal(t, aggs, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_aggregate_version WHERE last_applied_version = ?", versions))
	require.GreaterOrEqual(t, s.Stale, int64(aggs), "the late arrivals at least were skipped")
	require.EqualValues(t, aggs*versions+aggs, s.Applied+s.Stale)
	require.EqualValues(t, s.Applied, effects(t, db))
	require.EqualValues(t, s.Stale, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE status = 'STALE'"))
	require.Zero(t, s.Parked)
	t.Logf("COUNTS c (monotonic): aggregates=%d versions=%d published=%d applied=%d stale_skips=%d (of which %d late arrivals) dedup_hits=%d retries=%d",
		aggs, versions, aggs*versions+aggs, s.Applied, s.Stale, aggs, s.Duplicates, s.Retries)
}

func TestOutOfOrderStrict(t *testing.T) {
	t.Parallel()
	eachDB(t, testOutOfOrderStrict)
}

func testOutOfOrderStrict(t *testing.T, db *sqlx.DB) {
	createBox(t, db)
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 4)
	const aggs, versions = 10, 5
	var sends []wire.Envelope
	for a := range aggs {
		for v := 2; v <= versions; v++ {
			sends = append(sends, aggEv(wire.NewEventID(), fmt.Sprintf("box-%d", a), int64(v)))
		}
	}
	rand.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })
	c := startConsumer(t, db, topic, group, map[string]Route{"Moved": {Handler: boxHandler}},
		func(c *Config) { c.VersionMode = VersionStrict; c.MaxWaits = 100 })
	pb := newPublisher(t)
	for _, e := range sends {
		pb.send(topic, e, []byte(fmt.Sprintf("v%d", e.AggregateVersion)))
	}
	// Version 1 is missing: everything waits, nothing applies.
	testenv.Eventually(t, 60*time.Second, "gaps waited for", func() bool { return c.Processor().Stats().Gaps >= aggs*(versions-1) })
	require.Equal(t, 0, effects(t, db), "nothing applies across a gap")
	gapsBefore := c.Processor().Stats().Gaps
	for a := range aggs {
		pb.send(topic, aggEv(wire.NewEventID(), fmt.Sprintf("box-%d", a), 1), []byte("v1"))
	}
	testenv.Eventually(t, 90*time.Second, "all versions applied (and counted) once the gap closed", func() bool {
		return countRows(t, db, "SELECT COUNT(*) FROM box WHERE version = ?", versions) == aggs &&
			c.Processor().Stats().Applied >= aggs*versions
	})
	s := c.Processor().Stats()
	require.EqualValues(t, aggs*versions, s.Applied)
	require.Equal(t, aggs*versions, effects(t, db))
	require.Zero(t, s.Parked)
	// Per aggregate, the effects happened in version order 1..versions.
	for a := range aggs {
		var got []int64
		require.NoError(t, db.Select(&got, db.Rebind("SELECT version FROM effect WHERE agg_id = ? ORDER BY id"), fmt.Sprintf("box-%d", a)))
		require.Equal(t, []int64{1, 2, 3, 4, 5}, got)
	}
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt"), "waits cleared once applied")
	t.Logf("COUNTS c (strict): aggregates=%d versions=%d applied=%d gap_waits=%d (before v1 arrived: %d) retries=%d stale=%d parked=%d",
		aggs, versions, s.Applied, s.Gaps, gapsBefore, s.Retries, s.Stale, s.Parked)
}

// The ordered path with a version gap at the head of a key's line: the
// events pulled behind it run (the missing version may be one of them)
// instead of being handed back, so versions pulled newest first, and
// redelivered newest first each time, apply one per delivery. A failure
// that is not a gap still holds the later events of its key back.
func TestOrderGapHoldsNothingBack(t *testing.T) {
	t.Parallel()
	eachDB(t, testOrderGapHoldsNothingBack)
}

func testOrderGapHoldsNothingBack(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	failOnce := wire.NewEventID()
	var failed atomic.Bool
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.VersionMode = VersionStrict
		c.DelayLevel = func(Class, int) int { return 1 }
		c.Routes["Moved"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			if ev.ID == failOnce && failed.CompareAndSwap(false, true) {
				return Transient(fmt.Errorf("partner timeout"))
			}
			return effectHandler(ctx, tx, ev)
		}}
	})
	s := newSequencer()
	mq := primitive.MessageQueue{Topic: "t", BrokerName: "b", QueueId: 0}
	var offset int64
	var mu sync.Mutex
	outs := map[string]Outcome{}
	process := func(ctx context.Context, m Message) Outcome {
		o := p.Process(ctx, m)
		mu.Lock()
		outs[m.Properties[wire.PropEventID]] = o
		mu.Unlock()
		return o
	}
	// deliver pulls envs as one batch of the queue and hands each to its
	// own callback, as the push client does, concurrently.
	deliver := func(envs []wire.Envelope) map[string]Outcome {
		mu.Lock()
		outs = map[string]Outcome{}
		mu.Unlock()
		exts := make([]*primitive.MessageExt, len(envs))
		for i, e := range envs {
			body := []byte(fmt.Sprintf("v%d", e.AggregateVersion))
			m := &primitive.MessageExt{Message: primitive.Message{Topic: "t", Body: body}, QueueOffset: offset, MsgId: "m-" + e.EventID}
			m.WithProperties(e.Properties(body))
			offset++
			exts[i] = m
		}
		s.register(mq, exts)
		var wg sync.WaitGroup
		for _, m := range exts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = consumeOrdered(ctx, s, process, nil, []*primitive.MessageExt{m})
			}()
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return outs
	}

	// Newest first, and the retries come back newest first.
	var pending []wire.Envelope
	for v := int64(4); v >= 1; v-- {
		pending = append(pending, aggEv(wire.NewEventID(), "gap-box", v))
	}
	for round := 1; len(pending) > 0; round++ {
		require.LessOrEqual(t, round, 4, "one version applies per delivery; still pending: %d", len(pending))
		got := deliver(pending)
		var next []wire.Envelope
		for _, e := range pending {
			o, ran := got[e.EventID]
			require.True(t, ran, "v%d was handed back unprocessed behind a gap", e.AggregateVersion)
			if o.Result == ResultApplied {
				continue
			}
			require.ErrorIs(t, o.Err, ErrVersionGap, "v%d", e.AggregateVersion)
			next = append(next, e)
		}
		require.Len(t, next, len(pending)-1, "round %d applies exactly the next version", round)
		pending = next
	}
	var got []int64
	require.NoError(t, db.Select(&got, db.Rebind("SELECT version FROM effect WHERE agg_id = ? ORDER BY id"), "gap-box"))
	require.Equal(t, []int64{1, 2, 3, 4}, got)
	require.EqualValues(t, 3+2+1, p.Stats().Gaps)

	// A failure that is not a gap: v1 fails (transient), v2 pulled behind
	// it is held back unprocessed, then both apply in order on redelivery.
	v1, v2 := aggEv(failOnce, "held-box", 1), aggEv(wire.NewEventID(), "held-box", 2)
	got1 := deliver([]wire.Envelope{v1, v2})
	require.Equal(t, ResultRetry, got1[v1.EventID].Result)
	require.NotErrorIs(t, got1[v1.EventID].Err, ErrVersionGap)
	_, ran := got1[v2.EventID]
	require.False(t, ran, "v2 is held back behind the failed v1, not processed")
	got2 := deliver([]wire.Envelope{v1, v2})
	require.Equal(t, ResultApplied, got2[v1.EventID].Result)
	require.Equal(t, ResultApplied, got2[v2.EventID].Result)
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE agg_id = ? AND version = 2", "held-box"))
}

// countingResender records which event ids were re-sent by the batch path.
type countingResender struct {
	next resender
	mu   sync.Mutex
	ids  []string
}

func (c *countingResender) Resend(ctx context.Context, m *primitive.MessageExt, level int) error {
	c.mu.Lock()
	c.ids = append(c.ids, m.GetProperty(wire.PropEventID))
	c.mu.Unlock()
	return c.next.Resend(ctx, m, level)
}

func (c *countingResender) sent() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.ids...)
}

// d. Handler error: no dedup row is left behind, the message is redelivered,
// the later success gives one effect; siblings in its batch run once.
func TestHandlerErrorRedelivered(t *testing.T) {
	t.Parallel()
	for _, batch := range []int{1, 8} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			eachDB(t, func(t *testing.T, db *sqlx.DB) {
				topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
				testenv.CreateTopic(t, topic, 1) // one queue: the messages form batches
				var runs runCounter
				release := make(chan struct{})
				var redelivery atomic.Int32
				target := wire.NewEventID()
				routes := map[string]Route{"Created": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
					n := runs.add(ev.ID)
					if ev.ID == target {
						if n == 1 {
							if err := effectHandler(ctx, tx, ev); err != nil { // rolled back with the tx
								return err
							}
							return Transient(fmt.Errorf("partner timeout"))
						}
						redelivery.Store(int32(ev.Delivery.ReconsumeTimes))
						select {
						case <-release:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					return effectHandler(ctx, tx, ev)
				}}}
				pb := newPublisher(t)
				var ids []string
				for i := range 10 {
					id := wire.NewEventID()
					if i == 3 {
						id = target
					}
					ids = append(ids, id)
					pb.send(topic, ev(id, "Created"), []byte(fmt.Sprintf("p%d", i)))
				}
				cr := &countingResender{}
				c, err := New(Config{
					Group: group, DB: db, Routes: routes, DelayLevel: func(Class, int) int { return 1 },
					NameServers: []string{testenv.Load().NameServer}, Topic: topic, BatchSize: batch,
				})
				require.NoError(t, err)
				c.wrapResend = func(r resender) resender { cr.next = r; return cr }
				startBuilt(t, c)

				testenv.Eventually(t, 60*time.Second, "the failed attempt recorded", func() bool {
					return countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE event_id = ?", target) == 1
				})
				require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE event_id = ?", target), "no dedup row left behind")
				require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", target), "no effect left behind")
				close(release)
				testenv.Eventually(t, 60*time.Second, "all ten applied and counted", func() bool {
					return effects(t, db) == 10 && c.Processor().Stats().Applied >= 10
				})
				require.Equal(t, 2, runs.get(target), "redelivered once, then succeeded")
				require.EqualValues(t, 1, redelivery.Load(), "the redelivery says it is the first retry")
				for _, id := range ids {
					if id != target {
						require.Equal(t, 1, runs.get(id), "a sibling ran exactly once")
					}
				}
				require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", target))
				require.Equal(t, 1, countRows(t, db, "SELECT retry_count FROM rmqtx_consume_log WHERE event_id = ?", target))
				require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt"))
				s := c.Processor().Stats()
				require.EqualValues(t, 10, s.Applied)
				require.EqualValues(t, 1, s.Retries)
				if batch > 1 {
					require.Equal(t, []string{target}, cr.sent(), "only the failed message went back, alone")
				} else {
					require.Empty(t, cr.sent())
				}
				t.Logf("COUNTS d (batch=%d): effects=%d applied=%d retries=%d dedup_hits=%d resent_by_rmqtx=%d", batch, effects(t, db), s.Applied, s.Retries, s.Duplicates, len(cr.sent()))
			})
		})
	}
}

// e. Poison message: a payload that cannot be decoded is parked as permanent
// on its first attempt (so is a message without an envelope); the others in
// the same batches are unaffected.
func TestPoisonMessage(t *testing.T) {
	t.Parallel()
	eachDB(t, testPoisonMessage)
}

func testPoisonMessage(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 1)
	var runs runCounter
	routes := map[string]Route{"Created": {
		Validate: func(ev Event) error {
			var v struct{ N int }
			return json.Unmarshal(ev.Payload, &v)
		},
		Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			runs.add(ev.ID)
			return effectHandler(ctx, tx, ev)
		},
	}}
	pb := newPublisher(t)
	poison := wire.NewEventID()
	var good []string
	for i := range 12 {
		if i == 4 {
			e := ev(poison, "Created")
			e.BusinessKey = "order-poison"
			pb.send(topic, e, []byte(`{"N": "not a number`))
			continue
		}
		if i == 8 {
			raw := primitive.NewMessage(topic, []byte("no envelope at all"))
			raw.WithKeys([]string{"stray"})
			pb.sendRaw(raw)
			continue
		}
		id := wire.NewEventID()
		good = append(good, id)
		pb.send(topic, ev(id, "Created"), []byte(fmt.Sprintf(`{"N":%d}`, i)))
	}
	c := startConsumer(t, db, topic, group, routes, func(c *Config) { c.BatchSize = 8; c.Redact = KeepPayload })
	testenv.Eventually(t, 60*time.Second, "good ones applied and poison parked", func() bool {
		s := c.Processor().Stats()
		return s.Applied == int64(len(good)) && s.Parked == 2
	})
	s := c.Processor().Stats()
	require.Zero(t, s.Retries, "nothing was retried")
	require.Equal(t, len(good), effects(t, db))
	for _, id := range good {
		require.Equal(t, 1, runs.get(id))
	}
	require.Equal(t, 0, runs.get(poison), "the handler never saw the poison")
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt"))
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE event_id = ?", poison))
	dls, err := c.Processor().DeadLetters().List(context.Background(), DeadLetterFilter{ConsumerGroup: group, ErrorClass: ClassData})
	require.NoError(t, err)
	require.Len(t, dls, 2)
	byID := map[string]DeadLetter{}
	for _, d := range dls {
		byID[d.EventID] = d
		require.Equal(t, 0, d.ReconsumeTimes, "parked on the first attempt")
		require.Equal(t, 1, d.ParkCount)
		require.Equal(t, topic, d.Topic)
	}
	p := byID[poison]
	require.Equal(t, "order-poison", p.BusinessKey)
	require.Equal(t, `{"N": "not a number`, string(p.Payload))
	require.Equal(t, poison, p.Properties[wire.PropEventID])
	t.Logf("COUNTS e (poison): effects=%d applied=%d parked=%d retries=%d", effects(t, db), s.Applied, s.Parked, s.Retries)
}

// A new group's retry topic is created and routed before the client starts
// (Start calls ensureRetryTopic first), so its first retries need not wait
// for the client's periodic route refresh. The client itself is not started
// here: starting and at once stopping a push consumer trips the client's own
// shutdown race (fixed in third_party/rocketmq-client-go; see PATCHES.md).
func TestStartCreatesRetryTopic(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	db := testenv.MySQLDB(t) // New needs a database; this test is about the broker
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "cg")
	testenv.CreateTopic(t, topic, 2)
	retry := "%RETRY%" + group
	ctx := context.Background()
	_, err := remoting.MasterBrokers(ctx, []string{s.NameServer}, 0, retry)
	require.ErrorIs(t, err, remoting.ErrTopicNotFound, "a new group has no retry topic yet")

	c, err := New(Config{
		Group: group, DB: db,
		Routes:      map[string]Route{"Created": {Handler: func(context.Context, *sqlx.Tx, Event) error { return nil }}},
		NameServers: []string{s.NameServer},
		Topic:       topic,
	})
	require.NoError(t, err)
	c.ensureRetryTopic(ctx)
	brokers, err := remoting.MasterBrokers(ctx, []string{s.NameServer}, 0, retry)
	require.NoError(t, err)
	require.Equal(t, []string{s.Broker}, brokers)
	c.ensureRetryTopic(ctx) // an existing retry topic is left alone
}
