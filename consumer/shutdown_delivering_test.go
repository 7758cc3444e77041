package consumer

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// reqQueryConsumerOffset is the broker's QUERY_CONSUMER_OFFSET request.
const reqQueryConsumerOffset = 14

// TestShutdownWhileDelivering is the shutdown-while-delivering regression
// test of patch 3 (internal/testenv's TestPushConsumerShutdownWhileDeliveringIsRaceFree,
// third_party/rocketmq-client-go/PATCHES.md) driven through rmqtx's own
// Consumer.Shutdown, the path a service runs on the upstream client, where
// the client closes each queue's message channel while a pull goroutine may
// still send on it (apache/rocketmq-client-go#1051). Messages arrive all the
// time; in each round several consumers, each receiving, are shut down at
// once. Every round must end with
//
//   - no panic: the send runs in a goroutine with no recover, so a panic
//     ends this test binary (and under -race, a report fails it);
//   - no lost acknowledgement: for every message a handler applied, the
//     broker's committed offset of its group is past it, so nothing that
//     was applied is delivered again after a restart.
//
// make test runs it on both clients: the patched one under -race and the
// upstream one (scripts/upstream-mod.sh).
func TestShutdownWhileDelivering(t *testing.T) {
	t.Parallel()
	eachDB(t, testShutdownWhileDelivering)
}

func testShutdownWhileDelivering(t *testing.T, db *sqlx.DB) {
	s := testenv.Integration(t)
	ctx := context.Background()

	// A steady stream until the test ends, into the round's topic. Each
	// round has a topic of its own: a new group starts at a topic's first
	// message while the broker still holds it in memory, even with
	// FromLatest, so one topic's growing backlog would make every round
	// longer. Each consumer has a group of its own (like the patch-3 test),
	// so each applies every message: the rate keeps the database's load
	// modest, and at that rate each pull brings one or two messages, so the
	// pull goroutines are putting all the time.
	var current atomic.Pointer[string]
	var sendErrs atomic.Int64
	pb := newPublisher(t)
	stop := make(chan struct{})
	lim := rate.NewLimiter(60, 1)
	var senders sync.WaitGroup
	for range 2 {
		senders.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if lim.Wait(ctx) != nil {
					return
				}
				topic := current.Load()
				if topic == nil {
					continue
				}
				// Errors are counted, not fatal: the name server learns a
				// new round's topic a moment after it is created.
				e := ev(wire.NewEventID(), "Created")
				m := primitive.NewMessage(*topic, []byte(`{}`))
				m.WithProperties(e.Properties([]byte(`{}`)))
				if _, err := pb.p.SendSync(ctx, m); err != nil {
					sendErrs.Add(1)
				}
			}
		})
	}
	defer func() { close(stop); senders.Wait() }()

	const rounds, consumers = 20, 6
	var lost, applied, discarded int64
	for r := range rounds {
		topic := fmt.Sprintf("%s-%d", testenv.Name(t, "topic"), r)
		testenv.CreateTopic(t, topic, 8)
		brokers, err := remoting.MasterBrokers(ctx, []string{s.NameServer}, 0, topic)
		require.NoError(t, err)
		require.Len(t, brokers, 1, "the test bed has one master")
		current.Store(&topic)

		cs := make([]*Consumer, consumers)
		offs := make([]appliedOffsets, consumers)
		errs := make([]error, consumers)
		var wg sync.WaitGroup
		for i := range cs {
			group := fmt.Sprintf("%s-%d-%d", testenv.Name(t, "grp"), r, i)
			o := &offs[i]
			c, err := New(Config{
				Group: group, DB: db,
				Routes: map[string]Route{"Created": {Handler: func(_ context.Context, _ *sqlx.Tx, ev Event) error {
					o.add(group, ev.Delivery)
					return nil
				}}},
				NameServers: []string{s.NameServer},
				Topic:       topic,
			})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() }) // a no-op after Shutdown; for a round that failed
			cs[i] = c
			wg.Go(func() { errs[i] = c.Start(ctx) })
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d: start consumer %d", r, i)
		}
		// Every consumer is receiving: its pull goroutines are busy.
		testenv.Eventually(t, 60*time.Second, "every consumer to apply 10 messages", func() bool {
			for i := range offs {
				if offs[i].count() < 10 {
					return false
				}
			}
			return true
		})
		for i, c := range cs {
			wg.Go(func() {
				sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				errs[i] = c.Shutdown(sctx)
			})
		}
		wg.Wait()
		for i, c := range cs {
			require.NoError(t, errs[i], "round %d: shutdown consumer %d", r, i)
			discarded += c.pc.Discarded()
		}
		// The offsets are persisted with one-way requests at Shutdown's end:
		// wait for the broker to have them (or report what it lacks).
		for i := range offs {
			n, missing := offs[i].unacknowledged(t, brokers[0])
			applied += n
			lost += int64(len(missing))
			require.Empty(t, missing, "round %d consumer %d: applied messages the broker's offsets do not cover", r, i)
		}
	}
	t.Logf("COUNTS shutdown while delivering: rounds=%d consumers=%d applied=%d lost_acks=%d pulled_after_stop_and_dropped=%d send_errors=%d",
		rounds, consumers, applied, lost, discarded, sendErrs.Load())
}

// appliedOffsets is, per (group, topic, queue), the highest queue offset a
// handler applied.
type appliedOffsets struct {
	mu  sync.Mutex
	max map[[3]string]int64
	n   atomic.Int64
}

func (a *appliedOffsets) add(group string, d Delivery) {
	topic := d.Topic
	if d.ReconsumeTimes > 0 {
		topic = "%RETRY%" + group // a retry's offset is its retry queue's
	}
	k := [3]string{group, topic, strconv.Itoa(d.QueueID)}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.max == nil {
		a.max = map[[3]string]int64{}
	}
	if o, ok := a.max[k]; !ok || d.QueueOffset > o {
		a.max[k] = d.QueueOffset
	}
	a.n.Add(1)
}

func (a *appliedOffsets) count() int64 { return a.n.Load() }

// unacknowledged returns how many messages were applied and, after waiting
// up to 10 s for the broker, the queues whose committed offset is not past
// the highest applied one.
func (a *appliedOffsets) unacknowledged(t *testing.T, broker string) (int64, []string) {
	t.Helper()
	a.mu.Lock()
	want := make(map[[3]string]int64, len(a.max))
	for k, v := range a.max {
		want[k] = v
	}
	a.mu.Unlock()
	var missing []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		missing = missing[:0]
		for k, o := range want {
			if committed := queryOffset(t, broker, k); committed <= o {
				missing = append(missing, fmt.Sprintf("%s queue %s: applied %d, committed %d", k[1], k[2], o, committed))
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			return a.count(), missing
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-t.Context().Done():
			return a.count(), missing
		}
	}
}

// queryOffset returns the broker's committed offset of (group, topic,
// queue), or -1 if it has none.
func queryOffset(t *testing.T, broker string, k [3]string) int64 {
	t.Helper()
	h, _, err := remoting.RoundTrip(t.Context(), broker, 5*time.Second, reqQueryConsumerOffset,
		map[string]string{"consumerGroup": k[0], "topic": k[1], "queueId": k[2]})
	require.NoError(t, err)
	if h.Code == remoting.ResQueryNotFound {
		return -1
	}
	require.Equal(t, remoting.ResSuccess, h.Code, "query consumer offset: %s", h.Remark)
	o, err := strconv.ParseInt(h.ExtFields["offset"], 10, 64)
	require.NoError(t, err)
	return o
}
