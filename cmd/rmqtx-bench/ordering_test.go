package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/wire"
)

// The ordering workload's preloaded events: the no-key side's carry no
// routing key (the consumer orders nothing for them), the others their
// aggregate's as sharding key, with as many aggregates as the side says;
// and its check counts an event applied behind a later one of its key or
// off its key's queue.
func TestOrderingWorkloadEventsAndCheck(t *testing.T) {
	t.Parallel()
	const n = 64
	for side, aggs := range map[string]int{sideOrdNone: 0, sideOrdEach: n, sideOrdFew: orderingFew, sideOrdOne: 1} {
		keys := map[string]bool{}
		for i := range n {
			m := orderedMessage("t", side, "run", i, 1, []byte("{}"))
			env, err := wire.Decode(m.GetProperties())
			require.NoError(t, err, side)
			require.Equal(t, env.RoutingKey(), m.GetShardingKey(), side)
			if k := m.GetShardingKey(); k != "" {
				keys[k] = true
			}
		}
		require.Len(t, keys, aggs, side)
	}

	c := &orderCheck{last: map[string]int64{}}
	key := "Order/a"
	q := wire.QueueFor(key, orderingQueue)
	ev := func(queue int, offset int64) consumer.Event {
		return consumer.Event{AggregateType: "Order", AggregateID: "a", Delivery: consumer.Delivery{QueueID: queue, QueueOffset: offset}}
	}
	c.apply("g1", ev(q, 1))
	c.apply("g1", ev(q, 2))
	c.apply("g2", ev(q, 1))                                                    // another group starts over
	c.apply("g1", consumer.Event{Delivery: consumer.Delivery{QueueOffset: 0}}) // no key: not checked
	require.Zero(t, c.behind)
	require.Zero(t, c.misrouted)
	c.apply("g1", ev(q, 1))
	c.apply("g2", ev((q+1)%orderingQueue, 5))
	require.EqualValues(t, 1, c.behind)
	require.EqualValues(t, 1, c.misrouted)
}
