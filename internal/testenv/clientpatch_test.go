package testenv_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// TestClientShutdownUnderLoadIsRaceFree is the regression test for the
// patched client (third_party/rocketmq-client-go/PATCHES.md). It does what
// trips the upstream client's own data races under -race: push consumers
// that are shut down at once after Start, while their rebalance and pull
// goroutines run, and producers shut down while sends are in flight. With
// the upstream client the race detector fails this test (measured in
// PATCHES.md); with the patch it must pass. Under -race any report fails it.
func TestClientShutdownUnderLoadIsRaceFree(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	const rounds = 6
	var wg sync.WaitGroup
	for i := 0; i < rounds; i++ {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			group := fmt.Sprintf("%s-%d", testenv.Name(t, "cg"), i)
			c, err := rocketmq.NewPushConsumer(
				consumer.WithGroupName(group),
				consumer.WithInstance(group),
				consumer.WithNsResolver(s.NameServerResolver()),
			)
			require.NoError(t, err)
			require.NoError(t, c.Subscribe(topic, consumer.MessageSelector{}, func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
				return consumer.ConsumeSuccess, nil
			}))
			require.NoError(t, c.Start())
			require.NoError(t, c.Shutdown())
		}(i)
		go func(i int) {
			defer wg.Done()
			group := fmt.Sprintf("%s-%d", testenv.Name(t, "pg"), i)
			p, err := rocketmq.NewProducer(
				producer.WithGroupName(group),
				producer.WithInstanceName(group),
				producer.WithNsResolver(s.NameServerResolver()),
			)
			require.NoError(t, err)
			require.NoError(t, p.Start())
			var sends sync.WaitGroup
			for j := 0; j < 4; j++ {
				sends.Add(1)
				go func() {
					defer sends.Done()
					// Errors are expected once Shutdown has run; only the
					// race detector's verdict matters here.
					_, _ = p.SendSync(context.Background(), primitive.NewMessage(topic, []byte("x")))
				}()
			}
			require.NoError(t, p.Shutdown())
			sends.Wait()
		}(i)
	}
	wg.Wait()
}
