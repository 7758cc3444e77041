//go:build failpoints

package consumer

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

const (
	envHelperDB    = "RMQTX_CONSUMER_HELPER_DB"
	envHelperTopic = "RMQTX_CONSUMER_HELPER_TOPIC"
	envHelperGroup = "RMQTX_CONSUMER_HELPER_GROUP"
	envHelperBatch = "RMQTX_CONSUMER_HELPER_BATCH" // "1": BatchTransaction
)

// TestHelperProcessConsumer is not a test: TestCrashAfterCommitBeforeAck
// and TestCrashAfterBatchCommit re-execute the test binary to run it as a
// consumer process (in batch mode for the latter) that the armed failpoint
// kills with SIGKILL right after its first commit.
func TestHelperProcessConsumer(t *testing.T) {
	if !testenv.IsChild(t) {
		return // only meaningful as the child process
	}
	db := testenv.OpenDBRefEnv(t, envHelperDB) // either database: the parent's testenv.DBRef
	c, err := New(Config{
		Group: os.Getenv(envHelperGroup), DB: db,
		Routes:           map[string]Route{"Created": {Handler: effectHandler}},
		NameServers:      []string{testenv.Load().NameServer},
		Topic:            os.Getenv(envHelperTopic),
		BatchTransaction: os.Getenv(envHelperBatch) == "1",
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	// The failpoint ends this process; reaching the watchdog is a failure.
	watchdog, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	<-watchdog.Done()
	t.Fatal("consumer helper was not killed by the failpoint")
}

// f. Consumer killed after commit, before ACK: the redelivery is a dedup hit
// and the effect count does not change.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	t.Parallel()
	eachDB(t, testCrashAfterCommitBeforeAck)
}

func testCrashAfterCommitBeforeAck(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 2)
	id := wire.NewEventID()
	newPublisher(t).send(topic, ev(id, "Created"), []byte(`{"n":1}`))

	testenv.Child{Test: "TestHelperProcessConsumer", Failpoint: failpoint.AfterConsumeCommit, Timeout: 90 * time.Second, Env: []string{
		envHelperDB + "=" + testenv.DBRef(t, db), envHelperTopic + "=" + topic, envHelperGroup + "=" + group,
	}}.MustCrash(t)
	testenv.AwaitGroupEmpty(t, group, 3*time.Minute)

	// The child committed the effect and the dedup row, then died unACKed.
	require.Equal(t, 1, effects(t, db))
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE event_id = ? AND status = 'SUCCESS'", id))

	// A new instance of the group gets the message again: a dedup hit.
	c := startConsumer(t, db, topic, group, map[string]Route{"Created": {Handler: effectHandler}}, nil)
	if !testenv.Await(90*time.Second, func() bool { return c.Processor().Stats().Duplicates >= 1 }) {
		t.Fatalf("timed out after 90s waiting for the redelivery absorbed as a dedup hit: stats %+v; %s",
			c.Processor().Stats(), testenv.DescribeGroup(t, topic, group, 2))
	}
	s := c.Processor().Stats()
	require.Zero(t, s.Applied, "the handler did not run again")
	require.Equal(t, 1, effects(t, db), "the effect count did not change")
	t.Logf("COUNTS f (crash after commit): effects=%d dedup_hits_after_restart=%d applied_after_restart=%d", effects(t, db), s.Duplicates, s.Applied)
}
