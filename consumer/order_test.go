package consumer_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// Order per aggregate, end to end on the real broker (topic of 4 queues):
// each aggregate's versions are sent one after another, by txproducer.Send
// and by the outbox's RocketMQSink in turn, each as soon as the one before
// returned. An independent consumer (the
// test collector) shows every aggregate on the queue wire.QueueFor names,
// stored in version order; then the rmqtx consumer, single and batch mode,
// with VersionMonotonic, applies every aggregate's versions in order, with
// no STALE skip. The consumers start after everything is stored, so each
// pull hands over many events of a queue at once: the case the push
// consumer used to run concurrently out of order.
func TestOrderPerAggregateOnBroker(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		testOrderPerAggregate(t, db)
	})
}

func testOrderPerAggregate(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	s := testenv.Integration(t)
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)

	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{s.NameServer}, Group: testenv.Name(t, "pg"), DB: db,
		FenceAge: 4 * time.Second, CheckTimeout: 10 * time.Second,
		WarmupTopics: []string{topic}, DisableRecovery: true,
	})
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, p.Start(sctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, p.Shutdown(ctx))
	})
	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{s.NameServer},
		Group: testenv.Name(t, "ob"), InstanceName: testenv.Name(t, "obi")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })

	const aggs, versions = 12, 6
	var wg sync.WaitGroup
	errs := make(chan error, aggs)
	for a := 0; a < aggs; a++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			agg := fmt.Sprintf("o-%02d", a)
			for v := 1; v <= versions; v++ {
				payload := fmt.Appendf(nil, `{"agg":%q,"v":%d}`, agg, v)
				if (a+v)%2 == 0 {
					_, err := p.Send(ctx, txproducer.Message{Topic: topic, EventType: "OrderChanged",
						AggregateType: "Order", AggregateID: agg, AggregateVersion: int64(v), Payload: payload},
						func(context.Context, *sqlx.Tx) error { return nil })
					if err != nil {
						errs <- fmt.Errorf("send %s v%d: %w", agg, v, err)
						return
					}
					// No wait here: Send returns once the broker stored the
					// committed event (a keyed Send ends its transaction
					// itself, synchronously), so the next event, from Send
					// or the outbox, is stored after it.
					continue
				}
				m := &outbox.Message{Event: outbox.Event{EventID: wire.NewEventID(), EventType: "OrderChanged",
					AggregateType: "Order", AggregateID: agg, AggregateVersion: int64(v), Destination: topic, Payload: payload}, Attempt: 1}
				if err := sink.Send(ctx, m); err != nil {
					errs <- fmt.Errorf("outbox send %s v%d: %w", agg, v, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// (a), (b): one queue per aggregate, the one wire.QueueFor names (one
	// broker: the index is the queue id), stored in version order.
	snap := col.WaitDistinct(t, aggs*versions, time.Minute)
	type stored struct {
		queue   int
		offset  int64
		version int64
	}
	perAgg := map[string][]stored{}
	for id := range snap.Counts {
		m := col.Message(id)
		e, err := wire.Decode(m.GetProperties())
		require.NoError(t, err)
		perAgg[e.AggregateID] = append(perAgg[e.AggregateID], stored{m.Queue.QueueId, m.QueueOffset, e.AggregateVersion})
	}
	require.Len(t, perAgg, aggs)
	queuesUsed := map[int]bool{}
	for agg, ms := range perAgg {
		sort.Slice(ms, func(i, j int) bool { return ms[i].offset < ms[j].offset })
		require.Len(t, ms, versions)
		for i, m := range ms {
			require.Equal(t, wire.QueueFor("Order/"+agg, 4), m.queue, "aggregate %s v%d not on its queue", agg, m.version)
			require.EqualValues(t, i+1, m.version, "aggregate %s stored out of order", agg)
		}
		queuesUsed[ms[0].queue] = true
	}
	require.Greater(t, len(queuesUsed), 1, "12 aggregates spread over the queues")

	// (c): the rmqtx consumer applies them in order, single and batch mode.
	for _, mode := range []struct {
		name string
		mut  func(*consumer.Config)
	}{
		{"single", func(*consumer.Config) {}},
		{"batch", func(c *consumer.Config) { c.BatchTransaction = true }},
	} {
		var mu sync.Mutex
		applied := map[string][]int64{}
		route := consumer.Route{Handler: func(_ context.Context, _ *sqlx.Tx, ev consumer.Event) error {
			mu.Lock()
			applied[ev.AggregateID] = append(applied[ev.AggregateID], ev.AggregateVersion)
			mu.Unlock()
			return nil
		}}
		cfg := consumer.Config{Group: testenv.Name(t, "cg-"+mode.name), DB: db,
			Routes:      map[string]consumer.Route{"OrderChanged": route},
			VersionMode: consumer.VersionMonotonic, NameServers: []string{s.NameServer}, Topic: topic}
		mode.mut(&cfg)
		c, err := consumer.New(cfg)
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
		testenv.Eventually(t, 2*time.Minute, mode.name+": every event applied or skipped", func() bool {
			st := c.Processor().Stats()
			return st.Applied+st.Stale >= aggs*versions
		})
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		require.NoError(t, c.Shutdown(sctx))
		cancel()
		st := c.Processor().Stats()
		require.Zero(t, st.Stale, "%s: STALE skips", mode.name)
		require.EqualValues(t, aggs*versions, st.Applied, mode.name)
		mu.Lock()
		for agg, vs := range applied {
			want := make([]int64, versions)
			for i := range want {
				want[i] = int64(i + 1)
			}
			require.Equal(t, want, vs, "%s: apply order of %s", mode.name, agg)
		}
		require.Len(t, applied, aggs, mode.name)
		mu.Unlock()
	}
}
