package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/archive"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txproducer"
)

// A real flow driven through the CLI, on each database: a transactional
// send, a consumer that parks it, `rmqtx stuck` and `rmqtx dead list` show
// it, `rmqtx replay` once the handler is fixed, then `rmqtx inspect` with
// the broker lookup shows every table and the broker's record, `rmqtx
// stats` counts the rows and `rmqtx stuck` finds nothing left.
func TestRunbookFlow(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testRunbookFlow)
}

func testRunbookFlow(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	s := testenv.Integration(t)
	ctx := context.Background()
	env := map[string]string{"RMQTX_DSN": cliDSN(t, db), "RMQTX_NAMESRV": s.NameServer}
	r := runCLI(env, "config", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var cfg struct{ Driver string }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &cfg))
	require.Equal(t, db.DriverName(), cfg.Driver, "the DSN selects the database's driver")
	r = runCLI(env, "migrate")
	require.Equal(t, 0, r.code, r.stderr)
	_, err := db.Exec("CREATE TABLE points (event_id VARCHAR(64) PRIMARY KEY, points INT NOT NULL)")
	require.NoError(t, err)

	topic := testenv.Name(t, "orders")
	testenv.CreateTopic(t, topic, 2)
	group := testenv.Name(t, "points")
	var fixed atomic.Bool
	// KeepPayload: the dead letter keeps the payload so that it can be
	// replayed (dead letters store none by default).
	c, err := consumer.New(consumer.Config{Group: group, DB: db, Redact: consumer.KeepPayload, Routes: map[string]consumer.Route{
		"OrderPaid": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
			if !fixed.Load() {
				return consumer.Permanent(errors.New("points service rejects order"))
			}
			if err := ev.SetResultRef("points-for-" + ev.BusinessKey); err != nil {
				return err
			}
			_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO points (event_id, points) VALUES (?, 10)"), ev.ID)
			return err
		}},
	}, NameServers: []string{s.NameServer}, Topic: topic})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Close() })

	pgroup := testenv.Name(t, "ptx")
	p, err := txproducer.New(txproducer.Config{NameServers: []string{s.NameServer}, Group: pgroup, DB: db, WarmupTopics: []string{topic}})
	require.NoError(t, err)
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() { _ = p.Close() })
	res, err := p.Send(ctx, txproducer.Message{Topic: topic, Tags: "paid", EventType: "OrderPaid", BusinessKey: "order-42",
		Payload: []byte(`{"order":"order-42","card":"4111111111111111","amount":1999}`)}, func(ctx context.Context, tx *sqlx.Tx) error { return nil })
	require.NoError(t, err)
	id := res.EventID

	testenv.Eventually(t, 60*time.Second, "parked dead letter", func() bool {
		var n int
		require.NoError(t, db.Get(&n, db.Rebind("SELECT COUNT(*) FROM rmqtx_dead_letter WHERE event_id = ? AND status = 'PARKED'"), id))
		return n == 1
	})
	r = runCLI(env, "inspect", id)
	require.Equal(t, 1, r.code, "a parked dead letter needs attention:\n%s%s", r.stdout, r.stderr)
	r = runCLI(env, "stuck", "--older-than", "0s")
	require.Equal(t, 1, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, id)
	r = runCLI(env, "dead", "list", "--json", "--key", "order-42")
	require.Equal(t, 1, r.code, "a parked dead letter is a finding: %s%s", r.stdout, r.stderr)
	var dead []inspect.DeadLetterRow
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &dead))
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].EventID)
	r = runCLI(env, "dead", "show", strconv.FormatInt(dead[0].ID, 10))
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "points service rejects order")
	require.NotContains(t, r.stdout, "4111111111111111", "the payload is hidden")
	r = runCLI(env, "replay", "--dry-run", "--key", "order-42")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, id)

	fixed.Store(true)
	r = runCLI(env, "replay", "--key", "order-42", "--operator", "alice", "--reason", "points service fixed (INC-7)", "--rate", "2", "--json")
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	var rep struct {
		AuditID int64  `json:"audit_id"`
		Result  string `json:"result"`
		Sent    int    `json:"sent"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep))
	require.Equal(t, "COMPLETED", rep.Result)
	require.Equal(t, 1, rep.Sent)
	testenv.Eventually(t, 60*time.Second, "points applied", func() bool {
		var n int
		require.NoError(t, db.Get(&n, db.Rebind("SELECT COUNT(*) FROM points WHERE event_id = ?"), id))
		return n == 1
	})

	var v []inspect.EventView
	testenv.Eventually(t, 30*time.Second, "broker index shows the committed and the replayed message", func() bool {
		r = runCLI(env, "inspect", "--json", id)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil || len(v) != 1 {
			return false
		}
		var real, replayed int
		for _, m := range v[0].Broker {
			if m.Kind == "message" && m.ReplayAuditID == "" {
				real++
			}
			if m.ReplayAuditID != "" {
				replayed++
			}
		}
		return real == 1 && replayed == 1
	})
	require.NotNil(t, v[0].Txlog)
	require.Equal(t, "COMMITTED", v[0].Txlog.State)
	require.Len(t, v[0].Consumed, 1)
	require.Equal(t, "REPLAYED", v[0].DeadLetters[0].Status)
	require.Len(t, v[0].Replays, 1)
	r = runCLI(env, "inspect", id)
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, "4111111111111111")
	t.Logf("$ rmqtx inspect %s\n%s", id, r.stdout)
	require.True(t, strings.Contains(r.stdout, "== broker (by key)"))

	// Nothing is left to do, and stats counts what happened.
	r = runCLI(env, "stuck", "--older-than", "0s")
	require.Equal(t, 0, r.code, "nothing stuck after the replay: %s%s", r.stdout, r.stderr)
	r = runCLI(env, "stats")
	require.Equal(t, 0, r.code, r.stderr)
	for _, want := range []string{"rmqtx_txlog", "COMMITTED", "rmqtx_dead_letter", "REPLAYED", "rmqtx_replay_audit", "COMPLETED"} {
		require.Contains(t, r.stdout, want)
	}
	// The archive's dry run reads every table; nothing is old enough.
	r = runCLI(env, "archive", "--dry-run", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var plan archive.Report
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &plan), r.stdout)
	require.True(t, plan.DryRun)
	require.NotEmpty(t, plan.Rules)
	for _, rule := range plan.Rules {
		require.False(t, rule.Missing, rule.Table)
		require.Zero(t, rule.Eligible, rule.Table)
	}
}
