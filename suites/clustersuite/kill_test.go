//go:build failpoints

package clustersuite

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// routeRefresh is rocketmq-client-go's route refresh period: a client keeps
// sending to a dead broker's queues until its next refresh drops them.
const routeRefresh = 30 * time.Second

// TestBrokerKilledUnderLoad SIGKILLs broker-b while two producer instances,
// an outbox dispatcher and two consumers run a paced load, then starts it
// again.
//
//   - Transactional Sends fail over: the client retries a failed half on the
//     other broker, so Sends keep committing during the outage; the ones that
//     cannot fail with txproducer's typed errors.
//   - Halves stored on broker-b whose END_TRANSACTION died with it (Sends
//     held inside their local transaction across the kill) are decided once
//     it is back: by a check answered from the txlog, or, when the broker
//     gives them up before the group's instances heartbeat it again, by
//     discard recovery.
//   - The outbox pins events of an aggregate to one queue (hash of the
//     aggregate); rows pinned to broker-b's queues fail, park in RETRY and
//     are sent later.
//
// Lost 0, ghosts 0, double effects 0. Not parallel: it stops a broker.
//
// It runs on MariaDB and on PostgreSQL at once (subtests "mysql" and
// "postgres", each with its own bed, held Sends, pinned rows and load): one
// kill and one restart of broker-b hit both beds.
func TestBrokerKilledUnderLoad(t *testing.T) {
	testenv.Integration(t)
	suite.KeepUp(t, "broker-b")
	var sinks sinkStarts
	eachDB(t, "broker-b-killed", func(t *testing.T, b *bed, r *testbed.Rendezvous) { brokerKilledUnderLoad(t, b, r, &sinks) })
}

// sinkStarts are the start times of the beds' outbox sinks: the shared
// kill waits for a moment away from every sink's route refresh.
type sinkStarts struct {
	mu     sync.Mutex
	starts []time.Time
}

func (s *sinkStarts) add(at time.Time) {
	s.mu.Lock()
	s.starts = append(s.starts, at)
	s.mu.Unlock()
}

// killable reports whether every sink's next route refresh is at least
// 10 s away (and its last one a second past).
func (s *sinkStarts) killable() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, at := range s.starts {
		phase := time.Since(at) % routeRefresh
		if phase <= time.Second || phase >= routeRefresh-10*time.Second {
			return false
		}
	}
	return true
}

func brokerKilledUnderLoad(t *testing.T, b *bed, r *testbed.Rendezvous, sinks *sinkStarts) {
	p1, p2 := b.StartProducer(t, "p1", nil), b.StartProducer(t, "p2", nil)
	// p3 holds Sends whose half landed on broker-b inside their local
	// transaction until release is closed.
	release := make(chan struct{})
	located := make(chan string, 64) // broker address per held or passed half
	// A half is visible on its broker a moment before the client has the
	// broker's answer: a kill in between fails the Send itself (ErrSend; the
	// half is left to the check, which rolls it back), which is not the
	// held commit this test is about. So a Send's half is located only once
	// the client has the answer (HalfStored), and the held Send waits, before
	// its BEGIN, for the release.
	var storedMu sync.Mutex
	stored := map[string]chan struct{}{}
	storedCh := func(id string) chan struct{} {
		storedMu.Lock()
		defer storedMu.Unlock()
		if stored[id] == nil {
			stored[id] = make(chan struct{})
		}
		return stored[id]
	}
	p3 := b.StartProducer(t, "p3", func(c *txproducer.Config) {
		c.Test.HalfStored = func(id string) { close(storedCh(id)) }
		c.Test.BeforeLocalTx = func(ctx context.Context, id string) {
			select {
			case <-storedCh(id):
			case <-ctx.Done(): // the Send ended without a stored half
				located <- ""
				return
			}
			where := halfLocation(id)
			located <- where
			if where == suite.BrokerB {
				<-release
			}
		}
	})
	b.StartConsumer(t, "c1")
	b.StartConsumer(t, "c2")
	sinks.add(time.Now())
	d := b.StartDispatcher(t, outbox.Config{Name: "obx-kill", PollInterval: 200 * time.Millisecond, LeaseDuration: 5 * time.Second})

	// Per bed, both databases at once: a lighter load than one bed alone.
	var okAtBack, target int64 = 0, 120
	back := make(chan struct{})
	l := b.StartLoad(testbed.LoadConfig{Producers: []*txproducer.Producer{p1, p2}, Dispatcher: d, OutboxEvery: 4, Workers: 3, Limiter: rate.NewLimiter(10, 1),
		Stop: func(l *testbed.Load) bool {
			select {
			case <-back:
				return l.N.Load() >= target && l.OK.Load()-okAtBack >= 30
			default:
				return false
			}
		}})
	t.Cleanup(l.StopAndWait)
	testenv.Eventually(t, 90*time.Second, "the load to commit 30 events before the fault", func() bool { return l.OK.Load() >= 30 })

	// Two Sends held with their half on broker-b.
	var held []string
	var wg sync.WaitGroup
	for try := 0; len(held) < 2 && try < 24; try++ {
		id := wire.NewEventID()
		a := &testbed.Attempt{ID: id, Source: "tx"}
		b.Record(a)
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := p3.Send(context.Background(), b.Message(id), testbed.InsertOrder(id, "held", false))
			b.Answered(a, res.State, err)
		}()
		if where := <-located; where == suite.BrokerB {
			held = append(held, id)
		}
	}
	require.Len(t, held, 2, "two Sends held with their half on broker-b")

	// Kill when every sink's next route refresh is at least 10 s away, so
	// the rows pinned to broker-b below fail at least once before any
	// refresh.
	shared(t, r, "kill of broker-b", func() {
		testenv.Eventually(t, routeRefresh, "a kill moment away from every sink's route refresh", sinks.killable)
		suite.MustService(t, "kill9", "broker-b")
	})
	okAtKill, errsAtKill := l.OK.Load(), l.Errs.Load()
	killedAt := time.Now()

	// Outbox events of two aggregates pinned to broker-b's queues.
	// The dispatcher sends an aggregate's versions in order: version 2 waits
	// behind version 1, which parks in RETRY.
	var pinned, firsts []string
	for _, agg := range aggregatesOn(b.Route, "broker-b", 2) {
		for v := int64(1); v <= 2; v++ {
			e := b.OutboxEvent(wire.NewEventID(), agg, v)
			require.NoError(t, b.EnqueueOutbox(context.Background(), e, false, d))
			pinned = append(pinned, e.EventID)
			if v == 1 {
				firsts = append(firsts, e.EventID)
			}
		}
	}
	close(release) // the held local transactions commit; END_TRANSACTION goes nowhere
	wg.Wait()
	for _, id := range held {
		a, _ := b.Attempt(id)
		assert.NoError(t, a.Err, "held Send %s: its local transaction committed", id)
		assert.Equal(t, txproducer.StateCommitted, a.State, "held Send %s", id)
	}
	if !testenv.Await(60*time.Second, func() bool { return b.outboxRetried(firsts) == len(firsts) }) {
		t.Fatalf("the outbox rows pinned to broker-b did not park in RETRY: %s", b.outboxStates(pinned))
	}
	testenv.Eventually(t, 60*time.Second, "Sends to commit on broker-a during the outage", func() bool { return l.OK.Load()-okAtKill >= 20 })
	okDuringOutage, errsDuringOutage := l.OK.Load()-okAtKill, l.Errs.Load()-errsAtKill

	shared(t, r, "restart of broker-b", func() { suite.MustComeBack(t, "broker-b") })
	backAt := time.Now()
	okAtBack = l.OK.Load()
	close(back)

	// Held halves: decided once broker-b is back, by a check or by recovery.
	by := map[string]string{}
	testenv.Eventually(t, 100*time.Second, "the held halves on broker-b to be committed by a check or republished by recovery", func() bool {
		for _, id := range held {
			if by[id] == "" {
				// After the kill: a held half committed only after its
				// local transaction, released after the kill, so a COMMIT
				// answered for it came from broker-b after its restart,
				// possibly before services.sh found it usable (backAt).
				by[id] = b.resolvedAfter(id, killedAt)
			}
			if by[id] == "" {
				return false
			}
		}
		return true
	})
	if !l.Finished(2 * time.Minute) {
		t.Fatalf("the load did not finish after broker-b came back: %d committed since", l.OK.Load()-okAtBack)
	}
	b.Sc.Recover = b.Converge(t, 2*time.Minute).Sub(backAt)

	errs := b.SendErrs()
	require.Zero(t, errs["untyped"], "every Send error is one of txproducer's typed errors: %v", errs)
	ctx := context.Background()
	for _, id := range pinned {
		row, err := b.Obx.Get(ctx, b.DB, id)
		require.NoError(t, err)
		require.Equal(t, outbox.StatusSent, row.Status, "pinned row %s is sent in the end", id)
	}
	require.Empty(t, b.orderViolations(t), "every aggregate's effects in version order")
	b.Sc.Note("broker-b killed, usable again after %s; %d Sends/enqueues committed during the outage (failover to broker-a), %d errors; %d outbox rows of 2 aggregates pinned to broker-b parked in RETRY or waited behind them, all sent later in version order",
		backAt.Sub(killedAt).Round(100*time.Millisecond), okDuringOutage, errsDuringOutage, len(pinned))
	b.Sc.Note("halves left on broker-b by the kill: %v", by)
	b.Verify(t, 2*time.Minute)
}

// halfLocation returns the address of the broker whose index holds the half
// of id ("" when none shows it within 10 s).
func halfLocation(id string) string {
	look := inspect.RemotingLookup{Brokers: []string{suite.BrokerA, suite.BrokerB}, Timeout: 2 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ms, _ := look.QueryByKey(context.Background(), inspect.HalfTopic, id, 4); len(ms) > 0 {
			return ms[0].Broker
		}
	}
	return ""
}

// aggregatesOn returns n aggregate ids whose sharding key the outbox sink's
// hash selector maps to a queue of broker: the client lists a topic's
// queues sorted by broker name, and picks fnv32a(key) % len(queues).
func aggregatesOn(route []remoting.RouteBroker, broker string, n int) []string {
	var mqs []string
	for _, r := range route {
		for i := 0; i < r.WriteQueues; i++ {
			mqs = append(mqs, r.Name)
		}
	}
	var out []string
	for i := 0; len(out) < n; i++ {
		agg := fmt.Sprintf("agg-%s-%d", testenv.RandSuffix(6), i)
		h := fnv.New32a()
		_, _ = h.Write([]byte(outbox.ShardingKey(outbox.Event{AggregateType: "Order", AggregateID: agg})))
		q := int(h.Sum32()) % len(mqs)
		if q < 0 {
			q = -q
		}
		if mqs[q] == broker {
			out = append(out, agg)
		}
	}
	return out
}

// outboxRetried counts the rows of ids that failed at least once.
func (b *bed) outboxRetried(ids []string) int {
	q, args, err := sqlx.In("SELECT COUNT(*) FROM "+b.Obx.Name()+" WHERE retry_count > 0 AND event_id IN (?)", ids)
	if err != nil {
		return 0
	}
	var n int
	if err := b.DB.Get(&n, b.DB.Rebind(q), args...); err != nil {
		return 0
	}
	return n
}

// resolvedAfter says how the half of id was decided after t: "check" (a
// COMMIT answered to a check), "recovery" (republished from the txlog), or
// "" (not yet).
func (b *bed) resolvedAfter(id string, t time.Time) string {
	for _, a := range b.Answers(id) {
		if a.Decision == checkback.Commit && a.At.After(t) {
			return "check"
		}
	}
	for _, r := range b.Recovered(id) {
		if r.Decision == txlog.RecoveryRepublished {
			return "recovery"
		}
	}
	return ""
}

// outboxStates describes the rows of ids (status, retries, last error).
func (b *bed) outboxStates(ids []string) string {
	var out []string
	for _, id := range ids {
		r, err := b.Obx.Get(context.Background(), b.DB, id)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", id, err))
			continue
		}
		out = append(out, fmt.Sprintf("%s %s/%s v%d: %s retries=%d %s", id, r.AggregateType, r.AggregateID, r.AggregateVersion, r.Status, r.RetryCount, r.LastErrorMessage))
	}
	return strings.Join(out, "; ")
}
