package outbox

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// plainSink hides the RocketMQSink's BatchSink methods: a dispatcher with
// it leases its claims and writes each row twice (lease.go).
type plainSink struct{ s *RocketMQSink }

func (p plainSink) Send(ctx context.Context, m *Message) error { return p.s.Send(ctx, m) }

// TestLifecycleLeakWithTraffic: a RocketMQSink and a Dispatcher on it
// started, events enqueued, sent (SENT in the table and consumed by an
// independent collector), the Dispatcher shut down and the sink closed,
// four times after a warm-up lifecycle, alternately with held claims (the
// sink as a BatchSink) and leased ones (a plain Sink): every goroutine the
// lifecycles started ends, but the pool's connections and the client's own
// leftovers, listed by name (testenv.Leftover*). Both databases, one after
// the other (not parallel: it judges every goroutine of the process).
func TestLifecycleLeakWithTraffic(t *testing.T) {
	eachDBSerial(t, func(t *testing.T, b *bed) {
		topic := testenv.Name(t, "topic")
		testenv.CreateTopic(t, topic, 2)
		col := testenv.Collect(t, topic)
		const perLifecycle = 10
		total := 0
		lifecycle := func(held bool) {
			rs, err := NewRocketMQSink(RocketMQConfig{NameServers: []string{b.s.NameServer}, Group: testenv.Name(t, "pg"),
				InstanceName: testenv.Name(t, "inst")})
			require.NoError(t, err)
			var sink Sink = plainSink{rs}
			if held {
				sink = rs
			}
			d, err := NewDispatcher(Config{DB: b.db, Sink: sink, Name: testenv.Name(t, "leak"), BatchSize: 4,
				PollInterval: 50 * time.Millisecond})
			require.NoError(t, err)
			require.NoError(t, d.Start(context.Background()))
			ids := b.enqueue(t, events(topic, perLifecycle)...)
			total += perLifecycle
			b.waitStatus(t, StatusSent, total, time.Minute)
			require.True(t, col.WaitUntil(time.Minute, func(s testenv.Snapshot) bool {
				for _, id := range ids {
					if s.Counts[id] == 0 {
						return false
					}
				}
				return true
			}), "the lifecycle's events are consumed")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			require.NoError(t, d.Shutdown(ctx))
			require.NoError(t, rs.Shutdown(ctx))
		}
		lifecycle(true) // what a process sets up once is not a leak
		base := testenv.TakeLeakBaseline()
		const lifecycles = 4
		for i := range lifecycles {
			lifecycle(i%2 == 1)
		}
		base.AwaitNoLeak(t, fmt.Sprintf("outbox (%d events per lifecycle)", perLifecycle), lifecycles,
			testenv.PoolLeftover(b.db), testenv.LeftoverLateConnection)
		c := b.counts(t)
		require.Equal(t, (lifecycles+1)*perLifecycle, c[StatusSent], "every row SENT: %v", c)
		require.Equal(t, (lifecycles+1)*perLifecycle, col.Snapshot().Distinct(), "every event arrived")
	})
}
