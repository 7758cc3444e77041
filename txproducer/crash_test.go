//go:build failpoints

package txproducer_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// TestHelperProcess is the producer that gets killed. It only does
// something when re-executed by crashSend (testenv.Child); in a normal run
// it returns.
func TestHelperProcess(t *testing.T) {
	if !testenv.IsChild(t) {
		return
	}
	db, err := testenv.OpenDBRef(os.Getenv("RMQTX_HELPER_DB")) // either database: the parent's testenv.DBRef
	if err != nil {
		os.Exit(2)
	}
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{os.Getenv("RMQTX_HELPER_NAMESRV")}, Group: os.Getenv("RMQTX_HELPER_GROUP"), DB: db,
		DisableRecovery: true, FenceAge: testFenceAge,
	})
	if err != nil {
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.Start(ctx); err != nil {
		os.Exit(2)
	}
	id := os.Getenv("RMQTX_HELPER_EVENT_ID")
	_, _ = p.Send(ctx, txproducer.Message{Topic: os.Getenv("RMQTX_HELPER_TOPIC"), EventID: id, EventType: "OrderPlaced",
		Payload: []byte(`{"order":"` + id + `"}`)}, insertOrder(id))
	os.Exit(3) // the failpoint should have killed us
}

// crashSend runs one Send of event id in a subprocess of the same group and
// asserts it was killed by SIGKILL at the failpoint.
func crashSend(t *testing.T, b *bundle, point, id string) {
	t.Helper()
	testenv.Child{Test: "TestHelperProcess", Failpoint: point, Env: []string{
		"RMQTX_HELPER_DB=" + testenv.DBRef(t, b.db),
		"RMQTX_HELPER_NAMESRV=" + b.s.NameServer,
		"RMQTX_HELPER_GROUP=" + b.group,
		"RMQTX_HELPER_TOPIC=" + b.topic,
		"RMQTX_HELPER_EVENT_ID=" + id,
	}}.MustCrash(t)
}

// c. Killed after the half message, before the local transaction: the
// surviving instance fences and answers ROLLBACK; never consumed.
func TestCrashAfterHalfMessage(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testCrashAfterHalfMessage)
}

func testCrashAfterHalfMessage(t *testing.T, b *bundle) {
	survivor := startProducer(t, b.config())
	id := "crash-half-" + testenv.RandSuffix(6)
	crashSend(t, b, failpoint.AfterHalfMessage, id)

	row := b.waitRow(t, id, txlog.StateRolledBack)
	require.Equal(t, txlog.ByFence, row.ResolvedBy)
	as := b.rec.waitT(t, id, "survivor answers ROLLBACK", hasDecision(checkback.Rollback))
	noUnknownPastFenceAge(t, as)
	b.sendMarker(t, survivor)
	require.Zero(t, b.coll.Snapshot().Counts[id], "ghost event")
	var orders int
	require.NoError(t, b.db.Get(&orders, b.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	require.Zero(t, orders)
	t.Logf("crash after half: answers=%d final=%s (%s)", len(as), as[len(as)-1].Decision, as[len(as)-1].Reason)
}

// d. Killed after the local commit, before END_TRANSACTION: the survivor
// answers COMMIT from the txlog and the event is consumed.
func TestCrashAfterLocalCommit(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testCrashAfterLocalCommit)
}

func testCrashAfterLocalCommit(t *testing.T, b *bundle) {
	startProducer(t, b.config())
	id := "crash-commit-" + testenv.RandSuffix(6)
	crashSend(t, b, failpoint.AfterLocalCommit, id)

	row := b.row(t, id)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Equal(t, txlog.ByLocalCommit, row.ResolvedBy)
	as := b.rec.waitT(t, id, "survivor answers COMMIT", hasDecision(checkback.Commit))
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "committed event lost")
	for _, a := range as {
		require.NotEqual(t, checkback.Rollback, a.Decision)
	}
	t.Logf("crash after commit: answers=%d consumed=%d", len(as), b.coll.Snapshot().Counts[id])
}

// d'. Killed after the local commit, then the caller sends the same id
// again (it never learned the outcome): the retry reports the event as
// committed without running its function (its own half is rolled back),
// the check commits the first half, and the event arrives exactly once.
func TestCrashAfterLocalCommitThenResend(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testCrashAfterLocalCommitThenResend)
}

func testCrashAfterLocalCommitThenResend(t *testing.T, b *bundle) {
	p := startProducer(t, b.config())
	id := "resend-commit-" + testenv.RandSuffix(6)
	crashSend(t, b, failpoint.AfterLocalCommit, id)
	require.Equal(t, txlog.StateCommitted, b.row(t, id).State)

	ran := false
	res, err := p.Send(context.Background(), b.msg(id), func(context.Context, *sqlx.Tx) error { ran = true; return nil })
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.True(t, res.Duplicate)
	require.False(t, ran, "the function must not run again")

	b.rec.waitT(t, id, "the check commits the first half", hasDecision(checkback.Commit))
	b.exactlyOneCopy(t, p, id)
}

// Killed after the half message, before the local transaction; the caller
// sends the same id again at once, and that Send commits. The first half
// is then checked: the row was committed by the second half, so the check
// answers ROLLBACK for the first, and the event arrives exactly once.
func TestCrashAfterHalfMessageThenResend(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testCrashAfterHalfMessageThenResend)
}

func testCrashAfterHalfMessageThenResend(t *testing.T, b *bundle) {
	p := startProducer(t, b.config())
	id := "resend-half-" + testenv.RandSuffix(6)
	crashSend(t, b, failpoint.AfterHalfMessage, id)

	res, err := p.Send(context.Background(), b.msg(id), insertOrder(id))
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	require.False(t, res.Duplicate)

	as := b.rec.waitT(t, id, "the check rolls the crashed half back", hasDecision(checkback.Rollback))
	noUnknownPastFenceAge(t, as)
	require.Equal(t, txlog.StateCommitted, b.row(t, id).State, "the row still says COMMITTED")
	b.exactlyOneCopy(t, p, id)
}

// A crash after END_TRANSACTION changes nothing: the event is consumed and
// no check is needed.
func TestCrashAfterEndTransaction(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testCrashAfterEndTransaction)
}

func testCrashAfterEndTransaction(t *testing.T, b *bundle) {
	survivor := startProducer(t, b.config())
	id := "crash-end-" + testenv.RandSuffix(6)
	crashSend(t, b, failpoint.AfterEndTransaction, id)
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }))
	b.sendMarker(t, survivor)
	require.Equal(t, 1, b.coll.Snapshot().Counts[id], "one copy, counted after the marker")
	require.Equal(t, txlog.StateCommitted, b.row(t, id).State)
}

// Killed inside the local transaction, after the txlog insert: the server
// rolls back, the survivor fences, never consumed.
func TestCrashInsideLocalTx(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testCrashInsideLocalTx)
}

func testCrashInsideLocalTx(t *testing.T, b *bundle) {
	survivor := startProducer(t, b.config())
	id := "crash-inside-" + testenv.RandSuffix(6)
	crashSend(t, b, failpoint.InsideLocalTx, id)
	require.Equal(t, txlog.ByFence, b.waitRow(t, id, txlog.StateRolledBack).ResolvedBy)
	b.rec.waitT(t, id, "survivor answers ROLLBACK", hasDecision(checkback.Rollback))
	b.sendMarker(t, survivor)
	require.Zero(t, b.coll.Snapshot().Counts[id])
}

// g. Discard recovery: the group is offline after committing; the broker
// gives up after transactionCheckMax checks; recovery publishes the event
// again and it is consumed once.
func TestDiscardRecovery(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, testDiscardRecovery)
}

func testDiscardRecovery(t *testing.T, b *bundle) {
	decisions := make(chan discard.Result, 16)
	rec, err := discard.New(discard.Config{
		NameServers: []string{b.s.NameServer}, Group: b.group, Log: b.store, StartRetry: time.Second,
		OnDecision: func(r discard.Result) { decisions <- r },
	})
	require.NoError(t, err)
	require.NoError(t, rec.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, rec.Close()) })

	id := "discarded-" + testenv.RandSuffix(6)
	crashSend(t, b, failpoint.AfterLocalCommit, id)
	require.Equal(t, txlog.StateCommitted, b.row(t, id).State)

	var got discard.Result
	select {
	case got = <-decisions:
	case <-time.After(180 * time.Second):
		// The shared broker discards after about 67 s (32 checks).
		t.Fatal("no recovery decision within 180 s (broker discard after transactionCheckMax checks)")
	}
	require.NoError(t, got.Err)
	require.Equal(t, id, got.EventID)
	require.Equal(t, txlog.RecoveryRepublished, got.Decision)
	require.Equal(t, b.topic, got.Topic)
	row := b.row(t, id)
	require.Equal(t, txlog.RecoveryRepublished, row.RecoveryDecision)
	require.False(t, row.RecoveredAt.IsZero())

	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "recovered event not consumed")
	// A marker from another group, then exactly one delivery of the event.
	other := b.config()
	other.Group = testenv.Name(t, "marker")
	b.sendMarker(t, startProducer(t, other))
	require.Equal(t, 1, b.coll.Snapshot().Counts[id], "consumed once")
	m := b.coll.Message(id)
	require.Empty(t, m.GetProperty("TRAN_MSG"), "transaction properties are stripped")
	t.Logf("discard recovery: decision=%s msg_id=%s deliveries=%d", got.Decision, got.MsgID, b.coll.Snapshot().Counts[id])
}
