package consumer

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/wire"
)

// TestStartBeforeTopicExists deploys a consumer before its producer on a
// broker that does not auto-create topics (as production clusters run):
// Start succeeds on a topic nobody created yet, says so once at Warn, and
// the first event sent after an operator creates the topic is applied.
// The private broker is shared by the two databases' subtests (one topic
// and group each).
func TestStartBeforeTopicExists(t *testing.T) {
	pb := testenv.PrivateBroker(t, testenv.PrivateBrokerOptions{
		Name: "consumer-topic", EnvPrefix: "RMQTX_CONSUMER_PRIVATE",
		NamesrvPort: 17076, BrokerPort: 18511,
	})
	eachDB(t, func(t *testing.T, db *sqlx.DB) {
		topic := testenv.Name(t, "late")
		group := testenv.Name(t, "g")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := remoting.TopicRoute(ctx, pb.NameServers(), 5*time.Second, topic)
		require.ErrorIs(t, err, remoting.ErrTopicNotFound, "the topic does not exist yet")

		logger, hook := test.NewNullLogger()
		logger.SetLevel(logrus.DebugLevel)
		c, err := New(Config{
			Group: group, DB: db,
			Routes:      map[string]Route{"Created": {Handler: effectHandler}},
			NameServers: pb.NameServers(), Topic: topic,
			Observe: observe.Observe{Logger: logger},
		})
		require.NoError(t, err)
		startBuilt(t, c)
		warns := func() int {
			n := 0
			for _, e := range hook.AllEntries() {
				if e.Level == logrus.WarnLevel && e.Data["topic"] == topic && strings.Contains(e.Message, "does not exist") {
					n++
				}
			}
			return n
		}
		require.Equal(t, 1, warns(), "Start says once, at Warn, that the topic does not exist")

		pb.CreateTopic(t, topic, 4)
		p, err := rocketmq.NewProducer(
			producer.WithNsResolver(primitive.NewPassthroughResolver(pb.NameServers())),
			producer.WithGroupName(group+"_pub"), producer.WithInstanceName(group+"_pub"),
			producer.WithRetry(2),
		)
		require.NoError(t, err)
		require.NoError(t, p.Start())
		t.Cleanup(func() { _ = p.Shutdown() })
		env := wire.Envelope{EventID: "late-" + testenv.RandSuffix(8), EventType: "Created"}
		payload := []byte(`{"n":1}`)
		m := primitive.NewMessage(topic, payload)
		m.WithProperties(env.Properties(payload))
		res, err := p.SendSync(ctx, m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)

		// The client learns the new route on its periodic refresh (30 s) and
		// takes queues on its next rebalance (20 s).
		testenv.Eventually(t, 150*time.Second, "the first event applied", func() bool {
			return countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE consumer_group = ? AND event_id = ?", group, env.EventID) == 1
		})
		require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", env.EventID), "the handler ran once")
		require.Equal(t, 1, warns(), "the missing topic was reported once")
	})
}
