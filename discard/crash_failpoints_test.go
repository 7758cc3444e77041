//go:build failpoints

package discard_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
)

const (
	envRecoveryDB    = "RMQTX_RECOVERY_HELPER_DB"
	envRecoveryGroup = "RMQTX_RECOVERY_HELPER_GROUP"
)

// TestHelperProcessRecovery is not a test: TestRecoveryCrashAfterRepublish
// re-executes the test binary to run recovery in a process that the armed
// failpoint kills with SIGKILL right after its republish.
func TestHelperProcessRecovery(t *testing.T) {
	if !testenv.IsChild(t) {
		return // only meaningful as the child process
	}
	db := testenv.OpenDBRefEnv(t, envRecoveryDB) // either database: the parent's testenv.DBRef
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	r, err := discard.New(discard.Config{
		NameServers: []string{testenv.Load().NameServer}, Group: os.Getenv(envRecoveryGroup), Log: store,
		StartRetry: 500 * time.Millisecond,
	})
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	watchdog, cancel := context.WithTimeout(context.Background(), discardWait)
	defer cancel()
	<-watchdog.Done()
	t.Fatal("recovery helper was not killed by the failpoint")
}

// Recovery killed between the republish and MarkRecovered: the next pass
// (another instance of the group) gets the unacknowledged discarded half
// again, publishes it a second time and marks the txlog row. The event is
// on the topic twice; an rmqtx consumer applies its business effect once
// (its dedup absorbs the second copy).
func TestRecoveryCrashAfterRepublish(t *testing.T) {
	t.Parallel()
	eachDB(t, testRecoveryCrashAfterRepublish)
}

func testRecoveryCrashAfterRepublish(t *testing.T, b *discardBed) {
	ctx := context.Background()
	_, err := b.db.Exec("CREATE TABLE effects (event_id VARCHAR(64) NOT NULL, PRIMARY KEY (event_id))")
	require.NoError(t, err)
	require.NoError(t, schema.MigrateAll(ctx, b.db, "")) // the bed migrated the txlog; this adds the consumer tables
	c, err := consumer.New(consumer.Config{
		Group: testenv.Name(t, "cg"), DB: b.db,
		Routes: map[string]consumer.Route{"OrderPlaced": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
			_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO effects (event_id) VALUES (?)"), ev.ID)
			return err
		}}},
		NameServers: []string{b.s.NameServer}, Topic: b.topic,
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Close() })

	id := b.sendHalf(t, commitRow)
	testenv.Child{Test: "TestHelperProcessRecovery", Failpoint: failpoint.AfterRepublish, Timeout: 2 * discardWait, Env: []string{
		envRecoveryDB + "=" + testenv.DBRef(t, b.db), envRecoveryGroup + "=" + b.group,
	}}.MustCrash(t)

	// The child published the event and died before marking the row.
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "the first republish is on the topic")
	row := b.row(t, id)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Empty(t, row.RecoveryDecision, "not marked: the crash came first")

	// The next pass.
	_, res, m := b.startRecovery(t, b.store, nil)
	res.wait(t, 60*time.Second, "republished on the next pass", decided(id, txlog.RecoveryRepublished))
	require.Equal(t, txlog.RecoveryRepublished, b.row(t, id).RecoveryDecision, "marked on the next pass")
	// The gauge drops when the decision's goroutine returns, just after it
	// reports the decision: wait for it (bounded); a stuck gauge fails.
	testenv.Eventually(t, 10*time.Second, "undecided gauge back to 0", func() bool { return undecided(m, b.group) == 0 })
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] >= 2 }), "the second copy is on the topic")
	snap := b.settle(t)
	require.Equal(t, 2, snap.Counts[id], "one copy per pass")

	testenv.Eventually(t, 60*time.Second, "the second copy absorbed as a dedup hit", func() bool {
		return c.Processor().Stats().Duplicates >= 1
	})
	var effects int
	require.NoError(t, b.db.Get(&effects, b.db.Rebind("SELECT COUNT(*) FROM effects WHERE event_id = ?"), id))
	require.Equal(t, 1, effects, "one business effect")
	t.Logf("crash after republish: copies=%d effects=%d dedup_hits=%d", snap.Counts[id], effects, c.Processor().Stats().Duplicates)
}
