package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// TestEndToEnd runs the whole demo against the real broker and database:
// 60 payments with duplicate callbacks (concurrent and late), injected
// consumer failures, lost SMS responses, late callbacks for canceled
// orders, out-of-order order events, a producer restart halfway and
// redelivered events. Reconciliation must find nothing, and every count
// must be exact.
//
// It runs once per database: the example's business SQL has a MySQL and a
// PostgreSQL form, its rmqtx calls are the same.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testEndToEnd)
}

func testEndToEnd(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	s := testenv.Integration(t)
	log, lib, _ := newLoggers(testWriter{t}, false)
	const n, canceled, redelivered = 60, 6, 6
	cfg := RunConfig{
		DB: db, NameServers: []string{s.NameServer}, Broker: s.Broker, RunID: "t" + testenv.RandSuffix(10),
		Payments: n, DupRate: 0.3, FailRate: 0.15, CancelRate: float64(canceled) / n, RedeliverRate: float64(redelivered) / n,
		LostSMSRate: 0.2, Log: log, LibLog: lib, Timeout: 3 * time.Minute,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	require.NoError(t, err)
	var out bytes.Buffer
	PrintSummary(&out, res)
	t.Log("\n" + out.String())

	rep := res.Report
	require.True(t, res.Quiescent, "every derived result caught up")
	require.True(t, rep.OK(), "discrepancies: %+v", rep.Discrepancies)
	require.Zero(t, rep.Stuck, "`rmqtx stuck` lists nothing once quiescent (no attempt row of an applied event)")
	require.Zero(t, res.Driver.Unexpected, "every callback got the expected answer")

	// Payments and callbacks.
	require.Equal(t, n, res.Driver.Paid)
	require.Equal(t, n, rep.Succeeded)
	require.Equal(t, canceled, res.Driver.Canceled)
	require.Equal(t, n+canceled, rep.Orders)
	require.Equal(t, canceled, rep.OrdersCanceled)
	require.Zero(t, rep.Pending)
	require.EqualValues(t, n, res.Callbacks.Applied, "each payment applied exactly once")
	require.Positive(t, res.Driver.DupCallbacks)
	require.EqualValues(t, n+res.Driver.DupCallbacks, res.Callbacks.Applied+res.Callbacks.Duplicates,
		"every duplicate callback (and every retry of an applied one) was a no-op")
	require.EqualValues(t, canceled+3, res.Callbacks.Rejected, "late callbacks for canceled orders and 3 bad callbacks refused")
	require.Equal(t, canceled, res.Driver.Rejected)
	require.Equal(t, 3, res.Driver.BadRefused)
	require.GreaterOrEqual(t, int64(res.Driver.Retried503), res.Callbacks.Unavailable, "every 503 was retried")

	// The producer restarted halfway and the run still committed each
	// payment's event exactly once in the txlog.
	require.Equal(t, 1, res.Restarts)
	require.True(t, res.Driver.Restarted)
	require.Equal(t, n, rep.TxlogCommitted)

	// Points: exactly once, whatever was delivered twice.
	require.Equal(t, n, rep.PointsRows)
	require.EqualValues(t, n, res.Points.Applied)
	require.GreaterOrEqual(t, res.Points.Duplicates, int64(redelivered), "redeliveries absorbed by dedup")
	require.Equal(t, redelivered, res.Driver.Redelivered)

	// Notifications: one SMS per payment, resends absorbed by the key.
	require.Equal(t, n, rep.Notifications)
	require.EqualValues(t, n, res.Notify.Applied)
	require.GreaterOrEqual(t, res.Notify.Duplicates, int64(redelivered))
	require.Equal(t, n, rep.SMSKeys)
	require.EqualValues(t, n, res.SMSSent)
	require.EqualValues(t, res.SMSCalls, res.SMSSent+res.SMSResends)
	require.Positive(t, res.SMSLost)
	require.GreaterOrEqual(t, res.SMSResends, res.SMSLost, "each lost response was sent again")
	require.EqualValues(t, rep.SMSCalls, res.SMSCalls)

	// Projection: every order at its last version; the early orders'
	// OrderCreated arrived after OrderPaid and was skipped as stale.
	require.Equal(t, n+canceled, rep.ProjectionMatch)
	require.EqualValues(t, 2*n+2*canceled, res.Search.Applied+res.Search.Stale, "each order event applied or skipped once")
	require.GreaterOrEqual(t, res.Search.Stale, int64(res.Driver.EarlyPaid))
	require.Equal(t, n/4, res.Driver.EarlyPaid)

	// Injected failures were retried, none parked.
	require.Positive(t, res.Injected)
	require.GreaterOrEqual(t, res.Points.Retries+res.Notify.Retries+res.Search.Retries, res.Injected)
	require.Zero(t, res.Points.Parked+res.Notify.Parked+res.Search.Parked)
	require.Zero(t, rep.DeadLetters)

	// The reconcile command agrees, and catches a broken ledger.
	require.Equal(t, engineOf(db), res.Engine)
	reconcile := []string{"reconcile", "-engine", engineOf(db), "-db", testenv.DBName(t, db)}
	var stdout, stderr bytes.Buffer
	require.Equal(t, 0, realMain(reconcile, &stdout, &stderr), stderr.String())
	require.Contains(t, stdout.String(), "OK, 0 discrepancies")
	_, err = db.Exec(`DELETE FROM points_ledger WHERE id = (SELECT MIN(id) FROM (SELECT id FROM points_ledger) l)`)
	require.NoError(t, err)
	stdout.Reset()
	require.Equal(t, 1, realMain(reconcile, &stdout, &stderr))
	require.Contains(t, stdout.String(), "payment SUCCESS without points (1)")
	require.Contains(t, stdout.String(), "points balance differs from the ledger (1)")

	// ... and an attempt row left behind for an applied event, which
	// `rmqtx stuck` would list as RETRYING.
	var applied string
	require.NoError(t, db.Get(&applied, db.Rebind(`SELECT event_id FROM rmqtx_consume_log WHERE consumer_group = ? LIMIT 1`), NamesFor(cfg.RunID).PointsGroup))
	now := time.Now().UTC()
	_, err = db.Exec(db.Rebind(`INSERT INTO rmqtx_consume_attempt (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at)
		VALUES (?, ?, 1, 'transient', 'left behind', ?, ?)`), NamesFor(cfg.RunID).PointsGroup, applied, now, now)
	require.NoError(t, err)
	stdout.Reset()
	require.Equal(t, 1, realMain(reconcile, &stdout, &stderr))
	require.Contains(t, stdout.String(), "unfinished work listed by rmqtx stuck (1): RETRYING "+NamesFor(cfg.RunID).PointsGroup+"/"+applied)
	t.Log("\n" + strings.TrimSpace(stdout.String()))
}
