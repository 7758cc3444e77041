package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// `rmqtx topic create` on a broker that does not auto-create topics (as
// production clusters run): a send to the topic fails before, and
// succeeds right after the command returns. No database is involved, so
// the test runs once, not on each database.
func TestTopicCreate(t *testing.T) {
	pb := testenv.PrivateBroker(t, testenv.PrivateBrokerOptions{
		Name: "cli-topic", EnvPrefix: "RMQTX_CLI_PRIVATE",
		NamesrvPort: 17176, BrokerPort: 18611,
	})
	topic := testenv.Name(t, "created")
	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(primitive.NewPassthroughResolver(pb.NameServers())),
		producer.WithGroupName(topic+"_pub"), producer.WithInstanceName(topic+"_pub"),
		producer.WithRetry(0),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })
	send := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		res, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte("hello")))
		if err == nil && res.Status != primitive.SendOK {
			t.Fatalf("send status %d", res.Status)
		}
		return err
	}
	require.Error(t, send(), "the broker refuses a topic nobody created")

	env := map[string]string{"RMQTX_NAMESRV": pb.NameServer}
	r := runCLI(env, "topic", "create", "--name", topic, "--queues", "2", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	var views []topicView
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &views), r.stdout)
	require.Equal(t, []topicView{{Topic: topic, Cluster: "DefaultCluster", Broker: "broker-a", Addr: pb.Addr, ReadQueues: 2, WriteQueues: 2}}, views)
	require.NoError(t, send(), "the created topic accepts a send")

	// Again, as a table and with the cluster named: it updates in place.
	r = runCLI(env, "topic", "create", "--name", topic, "--queues", "2", "--cluster", "DefaultCluster")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "broker-a")
	require.NoError(t, send())

	r = runCLI(env, "topic", "create", "--name", topic, "--cluster", "NoSuchCluster")
	require.Equal(t, exitRuntime, r.code)
	require.Contains(t, r.stderr, "NoSuchCluster")
	r = runCLI(env, "topic", "create")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "--name is required")
	r = runCLI(env, "topic", "create", "--name", "%RETRY%x")
	require.Equal(t, exitUsage, r.code)
	r = runCLI(map[string]string{}, "topic", "create", "--name", topic)
	require.Equal(t, exitUsage, r.code, "no name server")
}
