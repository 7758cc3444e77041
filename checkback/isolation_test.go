package checkback_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
)

// The check reads committed data only, even through a pool whose sessions
// default to READ UNCOMMITTED: a local transaction that has inserted its
// COMMITTED txlog row but not committed (and then fails) is never answered
// COMMIT. The check stays bounded while it waits on that transaction's row
// lock. (Package discard proves the same for recovery.)
func TestCheckReadsCommittedOnly(t *testing.T) {
	t.Parallel()
	db := testenv.DB(t)
	store, err := txlog.New(db, txlog.DefaultPrefix)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, txlog.DefaultPrefix))
	ru, err := txlog.New(testenv.ReadUncommittedDB(t, db), txlog.DefaultPrefix)
	require.NoError(t, err)

	c, err := checkback.New(checkback.Config{Log: ru, Group: "g", FenceAge: 4 * time.Second, QueryTimeout: 500 * time.Millisecond})
	require.NoError(t, err)

	id := envelope.NewEventID()
	body := []byte(`{"ghost":true}`)
	row := committedRow(id, "orders", "u1", body)
	row.ProducerGroup = "g"
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, store.Insert(ctx, tx, row)) // in flight: inserted first, not committed
	var dirty int
	require.NoError(t, ru.DB().Get(&dirty, "SELECT COUNT(*) FROM "+ru.Table()+" WHERE event_id = ?", id))
	require.Equal(t, 1, dirty, "precondition: the session reads uncommitted rows")

	q := checkback.Query{EventID: id, Topic: "orders", PayloadHash: envelope.Hash(body)}
	young := q
	young.BornAt = time.Now()
	a := c.CheckQuery(ctx, young)
	require.Equal(t, checkback.Unknown, a.Decision, "an in-flight transaction is not committed: %+v", a)
	require.Equal(t, checkback.ReasonYoung, a.Reason)

	old := q
	old.BornAt = time.Now().Add(-time.Minute)
	a = c.CheckQuery(ctx, old)
	require.Equal(t, checkback.Unknown, a.Decision, "the fence waits on the row lock: %+v", a)
	require.Equal(t, checkback.ReasonError, a.Reason)
	require.Less(t, a.Duration, 3*time.Second, "bounded by QueryTimeout")

	require.NoError(t, tx.Rollback()) // the local transaction fails
	// The fence of the timed-out check may still complete on the server once
	// the lock is released: the row then exists (found) or is written now
	// (fenced); either way the answer is ROLLBACK.
	a = c.CheckQuery(ctx, old)
	require.Equal(t, checkback.Rollback, a.Decision, "%+v", a)
	require.Contains(t, []checkback.Reason{checkback.ReasonFenced, checkback.ReasonFound}, a.Reason)
	a = c.CheckQuery(ctx, young)
	require.Equal(t, checkback.Rollback, a.Decision, "final once decided")
}
