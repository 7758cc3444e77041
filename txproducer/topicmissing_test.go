package txproducer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// TestStartMissingWarmupTopic starts a producer whose warm-up topic does
// not exist on a broker that does not auto-create topics, as production
// clusters run: Start fails with ErrTopicNotFound (and ErrStart), naming
// the topic and saying it must be created. Once the topic is created, a
// new producer starts and commits a Send to it. The private broker serves
// both databases' subtests.
func TestStartMissingWarmupTopic(t *testing.T) {
	pb := testenv.PrivateBroker(t, testenv.PrivateBrokerOptions{
		Name: "txproducer-topic", EnvPrefix: "RMQTX_TXPRODUCER_TOPIC",
		NamesrvPort: 17276, BrokerPort: 18711,
	})
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
		_, err := db.Exec("CREATE TABLE orders (id VARCHAR(64) NOT NULL PRIMARY KEY, amount INT NOT NULL)")
		require.NoError(t, err)
		topic := testenv.Name(t, "missing")
		cfg := txproducer.Config{
			NameServers:     pb.NameServers(),
			Group:           testenv.Name(t, "pg"),
			DB:              db,
			FenceAge:        testFenceAge,
			WarmupTopics:    []string{topic},
			DisableRecovery: true,
		}
		p, err := txproducer.New(cfg)
		require.NoError(t, err)
		err = p.Start(ctx)
		require.Error(t, err)
		require.ErrorIs(t, err, txproducer.ErrTopicNotFound)
		require.ErrorIs(t, err, txproducer.ErrStart)
		require.Contains(t, err.Error(), topic)
		require.Contains(t, err.Error(), "create it")
		t.Logf("Start: %v", err)
		require.NoError(t, p.Shutdown(ctx))

		pb.CreateTopic(t, topic, 2)
		p = startProducer(t, cfg)
		res, err := p.Send(ctx, txproducer.Message{Topic: topic, EventID: "e-" + testenv.RandSuffix(8),
			EventType: "OrderPlaced", Payload: []byte(`{"amount":1}`)}, insertOrder("o-1"))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)

	})
}
