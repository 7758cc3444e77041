//go:build failpoints

package consumer

import (
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// Batch mode killed after a batch's commit, before its ACK: the batch is
// delivered again to a new instance, every event of it is a dedup hit, and
// each event's effect exists exactly once.
func TestCrashAfterBatchCommit(t *testing.T) {
	t.Parallel()
	eachDB(t, testCrashAfterBatchCommit)
}

func testCrashAfterBatchCommit(t *testing.T, db *sqlx.DB) {
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 1) // one queue: the first pull holds many messages
	const n = 40
	ids := make([]string, n)
	pub := newPublisher(t)
	for i := range ids {
		ids[i] = wire.NewEventID()
		pub.send(topic, ev(ids[i], "Created"), fmt.Appendf(nil, `{"n":%d}`, i))
	}

	testenv.Child{Test: "TestHelperProcessConsumer", Failpoint: failpoint.AfterConsumeCommit, Timeout: 90 * time.Second, Env: []string{
		envHelperDB + "=" + testenv.DBRef(t, db), envHelperTopic + "=" + topic, envHelperGroup + "=" + group, envHelperBatch + "=1",
	}}.MustCrash(t)
	testenv.AwaitGroupEmpty(t, group, 3*time.Minute)

	// The child committed one batch (several events with their dedup rows)
	// and died before answering the broker.
	committed := effects(t, db)
	require.Greater(t, committed, 1, "the first batch held several events")
	require.Equal(t, committed, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log"))

	c := startConsumer(t, db, topic, group, map[string]Route{"Created": {Handler: effectHandler}}, func(cfg *Config) {
		cfg.BatchTransaction = true
	})
	if !testenv.Await(90*time.Second, func() bool {
		s := c.Processor().Stats()
		return s.Applied+s.Duplicates >= n && s.Applied >= int64(n-committed) && effects(t, db) == n
	}) {
		t.Fatalf("timed out after 90s waiting for every event applied or absorbed: stats %+v, effects %d; %s",
			c.Processor().Stats(), effects(t, db), testenv.DescribeGroup(t, topic, group, 1))
	}
	s := c.Processor().Stats()
	require.Equal(t, n, effects(t, db))
	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM (SELECT event_id FROM effect GROUP BY event_id HAVING COUNT(*) > 1) d"), "0 double effects")
	for _, id := range ids {
		require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", id))
	}
	require.EqualValues(t, n-committed, s.Applied, "the new instance applied only what the child had not")
	require.GreaterOrEqual(t, s.Duplicates, int64(committed), "the committed batch came back as dedup hits")
	t.Logf("COUNTS batch crash after commit: child committed %d events in its first batch; after restart applied %d, dedup hits %d; effects %d, doubles 0",
		committed, s.Applied, s.Duplicates, effects(t, db))
}
