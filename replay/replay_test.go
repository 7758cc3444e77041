package replay_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/wire"
)

// Dead letters made by a real consumer are replayed through the broker to
// that consumer once its handler is fixed: one effect each, original event
// ids, an audit row; a second replay is a dedup hit, not a second effect.
func TestReplayEndToEnd(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testReplayEndToEnd)
}

func testReplayEndToEnd(t *testing.T, db *sqlx.DB) {
	s := testenv.Integration(t)
	migrated(t, db)
	ctx := context.Background()
	_, err := db.Exec("CREATE TABLE effects (event_id VARCHAR(64) NOT NULL PRIMARY KEY, applied INT NOT NULL)")
	require.NoError(t, err)
	d := dialect.Must(db)
	applyEffect := d.Rebind(d.Upsert("effects", "event_id, applied", "?, 1", "event_id", "applied = applied + 1"))
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 2)
	group := testenv.Name(t, "group")
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	require.NoError(t, err)

	var fixed atomic.Bool
	c, err := consumer.New(consumer.Config{
		// Replay needs the stored payload: dead letters keep none by default.
		Group: group, DB: db, Observe: observe.Observe{Metrics: m}, Redact: consumer.KeepPayload, Routes: map[string]consumer.Route{
			"OrderPaid": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
				if !fixed.Load() {
					return consumer.Permanent(errors.New("downstream rejects the order"))
				}
				_, err := tx.ExecContext(ctx, applyEffect, ev.ID)
				return err
			}},
		},
		NameServers: []string{s.NameServer}, Topic: topic,
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { _ = c.Close() })
	col := testenv.Collect(t, topic)

	const n = 5
	envs := make([]wire.Envelope, n)
	for i := range envs {
		envs[i] = wire.Envelope{EventID: wire.NewEventID(), EventType: "OrderPaid", BusinessKey: "order-" + strconv.Itoa(i)}
	}
	publish(t, s, topic, envs, func(e wire.Envelope) []byte {
		return []byte(`{"order":"` + e.BusinessKey + `","card":"4111111111111111"}`)
	})
	testenv.Eventually(t, 90*time.Second, "5 parked dead letters", func() bool {
		return countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter WHERE consumer_group = ? AND status = 'PARKED'", group) == n
	})
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE consumer_group = ?", group), "a parked event has no dedup row")

	fixed.Store(true)
	r := newReplayer(t, replay.Config{DB: db, NameServers: []string{s.NameServer}, Observe: observe.Observe{Metrics: m}, Rate: 50, Batch: 2,
		Group: testenv.Name(t, "replay"), InstanceName: testenv.Name(t, "replayinst")})
	rep, err := r.Replay(ctx, replay.Request{Selector: replay.Selector{ConsumerGroup: group}, Operator: "alice", Reason: "handler fixed in v1.2.3"})
	require.NoError(t, err)
	require.Equal(t, replay.ResultCompleted, rep.Result, "%+v", rep)
	require.Equal(t, n, rep.Sent)
	testenv.Eventually(t, 60*time.Second, "5 effects", func() bool {
		return countRows(t, db, "SELECT COUNT(*) FROM effects") == n
	})
	snap := col.WaitDistinct(t, n, 30*time.Second)
	require.True(t, col.WaitUntil(30*time.Second, func(s testenv.Snapshot) bool { return s.Total >= 2*n }), "original + replay of each id")
	for _, e := range envs {
		require.GreaterOrEqual(t, snap.Counts[e.EventID]+0, 1, "original event id %s seen", e.EventID)
	}

	// The audit row.
	a, err := r.GetAudit(ctx, rep.AuditID)
	require.NoError(t, err)
	require.Equal(t, "alice", a.Operator)
	require.Equal(t, "handler fixed in v1.2.3", a.Reason)
	require.Contains(t, a.Scope, group)
	require.Equal(t, replay.ResultCompleted, a.Result)
	require.Equal(t, [4]int{n, n, 0, 0}, [4]int{a.Selected, a.Sent, a.Failed, a.Skipped})
	require.NotNil(t, a.FinishedAt)
	items, err := r.AuditItems(ctx, rep.AuditID)
	require.NoError(t, err)
	require.Len(t, items, n)
	require.Equal(t, n, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter WHERE consumer_group = ? AND status = 'REPLAYED' AND replay_count = 1 AND replayed_at IS NOT NULL", group))

	// The broker holds the replayed message under the ORIGINAL event id, with
	// the replay metadata in its properties.
	look := inspect.RemotingLookup{NameServers: []string{s.NameServer}}
	var msgs []inspect.BrokerMessage
	testenv.Eventually(t, 30*time.Second, "broker index has original and replay", func() bool {
		msgs, err = look.QueryByKey(ctx, topic, envs[0].EventID, 32)
		return err == nil && len(msgs) >= 2
	})
	var replayed int
	for _, bm := range msgs {
		if bm.ReplayAuditID == strconv.FormatInt(rep.AuditID, 10) {
			replayed++
		}
	}
	require.Equal(t, 1, replayed, "one replayed message carries audit id %d: %+v", rep.AuditID, msgs)
	// Each replay went to the queue of its routing key (the business key
	// here; one broker: the queue id is wire.QueueFor's index), whichever
	// queue the plain original went to.
	for _, e := range envs {
		var ms []inspect.BrokerMessage
		testenv.Eventually(t, 30*time.Second, "broker index has the replay of "+e.EventID, func() bool {
			ms, err = look.QueryByKey(ctx, topic, e.EventID, 32)
			return err == nil && slices.ContainsFunc(ms, func(bm inspect.BrokerMessage) bool { return bm.ReplayAuditID != "" })
		})
		for _, bm := range ms {
			if bm.ReplayAuditID != "" {
				require.Equal(t, wire.QueueFor(e.BusinessKey, 2), bm.QueueID, "replay of %s (key %s)", e.EventID, e.BusinessKey)
			}
		}
	}

	// Second replay of the same dead letters: a dedup hit each, no new effect.
	dupBefore := c.Processor().Stats().Duplicates
	rep2, err := r.Replay(ctx, replay.Request{Selector: replay.Selector{ConsumerGroup: group, IncludeReplayed: true}, Operator: "bob", Reason: "again, by mistake"})
	require.NoError(t, err)
	require.Equal(t, n, rep2.Sent)
	testenv.Eventually(t, 60*time.Second, "5 dedup hits", func() bool { return c.Processor().Stats().Duplicates >= dupBefore+n })
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM effects WHERE applied <> 1"), "no effect applied twice")
	require.Equal(t, n, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter WHERE consumer_group = ? AND replay_count = 2", group))

	// Metrics, read back through the registry.
	sent := metricValue(t, reg, "rmqtx_replay_messages_total", map[string]string{"destination": topic, "result": "sent"})
	dedup := metricValue(t, reg, "rmqtx_consumer_dedup_hits_total", map[string]string{"consumer_group": group, "event_type": "OrderPaid"})
	parked := metricValue(t, reg, "rmqtx_consumer_dead_letters_total", map[string]string{"consumer_group": group, "error_class": "permanent"})
	applied := metricValue(t, reg, "rmqtx_consumer_messages_total", map[string]string{"consumer_group": group, "result": "applied"})
	t.Logf("metrics: replay sent=%v dedup_hits=%v dead_letters=%v applied=%v rate_gauge=%v", sent, dedup, parked, applied,
		metricValue(t, reg, "rmqtx_replay_rate_limit", nil))
	require.Equal(t, float64(2*n), sent)
	require.GreaterOrEqual(t, dedup, float64(n))
	require.Equal(t, float64(n), parked)
	require.Equal(t, float64(n), applied)
	require.Equal(t, 0.0, metricValue(t, reg, "rmqtx_replay_rate_limit", nil), "no replay running")
}

// The rate limit holds: measured from the send timestamps, never faster than
// the configured rate (generous bound), whatever the machine.
func TestReplayRateLimit(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testReplayRateLimit)
}

func testReplayRateLimit(t *testing.T, db *sqlx.DB) {
	s := testenv.Integration(t)
	migrated(t, db)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 2)
	col := testenv.Collect(t, topic)
	group := "g-rate"
	const n, perSecond = 12, 8.0
	for range n {
		insertDeadLetter(t, db, deadLetter{Group: group, Topic: topic})
	}
	r := newReplayer(t, replay.Config{DB: db, NameServers: []string{s.NameServer}, Group: testenv.Name(t, "replay"), InstanceName: testenv.Name(t, "ri")})
	rep, err := r.Replay(context.Background(), replay.Request{Selector: replay.Selector{ConsumerGroup: group}, Operator: "ops", Reason: "rate test",
		Rate: perSecond, Batch: 4})
	require.NoError(t, err)
	require.Equal(t, replay.ResultCompleted, rep.Result)
	require.Equal(t, n, rep.Sent)
	first, last := rep.Items[0].SentAt, rep.Items[0].SentAt
	for _, it := range rep.Items {
		if it.SentAt.Before(first) {
			first = it.SentAt
		}
		if it.SentAt.After(last) {
			last = it.SentAt
		}
	}
	measured := float64(n-1) / last.Sub(first).Seconds()
	snap := col.WaitDistinct(t, n, 30*time.Second)
	var bornFirst, bornLast int64
	for id := range snap.Counts {
		b := col.Message(id).BornTimestamp
		if bornFirst == 0 || b < bornFirst {
			bornFirst = b
		}
		if b > bornLast {
			bornLast = b
		}
	}
	brokerRate := float64(n-1) / (float64(bornLast-bornFirst) / 1000)
	t.Logf("rate limit %.1f/s: measured %.2f msgs/s from send timestamps, %.2f msgs/s from broker born timestamps (%d messages over %s)",
		perSecond, measured, brokerRate, n, last.Sub(first).Round(time.Millisecond))
	require.LessOrEqual(t, measured, perSecond*1.25, "replay faster than its rate limit")
	require.LessOrEqual(t, brokerRate, perSecond*1.5, "broker saw the replay faster than its rate limit")
}

// A replay stops by itself once new dead letters pass the threshold, after
// the batch in progress; what it did not send stays PARKED.
func TestReplayStopsOnNewDeadLetters(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testReplayStopsOnNewDeadLetters)
}

func testReplayStopsOnNewDeadLetters(t *testing.T, db *sqlx.DB) {
	s := testenv.Integration(t)
	migrated(t, db)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 2)
	group := "g-stop"
	for range 10 {
		insertDeadLetter(t, db, deadLetter{Group: group, Topic: topic})
	}
	var hookDB = db
	r := newReplayer(t, replay.Config{DB: db, NameServers: []string{s.NameServer}, StopAfterNewDeadLetters: 2,
		Group: testenv.Name(t, "replay"), InstanceName: testenv.Name(t, "ri"),
		Test: replay.TestConfig{AfterBatch: func(batch int) {
			if batch == 1 { // the downstream breaks again: two fresh dead letters
				for range 2 {
					insertDeadLetter(t, hookDB, deadLetter{Group: group, Topic: topic, FirstSeen: time.Now().UTC().Add(time.Second)})
				}
			}
		}}})
	rep, err := r.Replay(context.Background(), replay.Request{Selector: replay.Selector{ConsumerGroup: group, Limit: 10}, Operator: "ops", Reason: "stop test",
		Rate: 100, Batch: 3})
	require.NoError(t, err)
	require.Equal(t, replay.ResultStopped, rep.Result)
	require.Equal(t, 3, rep.Sent)
	require.Equal(t, 2, rep.NewDeadLetters)
	require.Equal(t, 9, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter WHERE consumer_group = ? AND status = 'PARKED'", group), "7 unsent + 2 new")
	a, err := r.GetAudit(context.Background(), rep.AuditID)
	require.NoError(t, err)
	require.Equal(t, replay.ResultStopped, a.Result)
	require.Equal(t, 2, a.NewDeadLetters)
}

// DryRun selects by id, group, type, key, class and time range, only PARKED
// rows (REPLAYED with IncludeReplayed), and says what it would skip.
func TestDryRunSelectors(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testDryRunSelectors)
}

func testDryRunSelectors(t *testing.T, db *sqlx.DB) {
	migrated(t, db)
	t0 := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	a := insertDeadLetter(t, db, deadLetter{Group: "g1", Topic: "T", Type: "OrderPaid", Key: "k1", FirstSeen: t0})
	b := insertDeadLetter(t, db, deadLetter{Group: "g1", Topic: "T", Type: "OrderShipped", Key: "k2", Class: "data", FirstSeen: t0.Add(time.Hour)})
	cRedacted := insertDeadLetter(t, db, deadLetter{Group: "g1", Topic: "T", Redacted: true, Hash: wire.Hash([]byte("original")), FirstSeen: t0.Add(2 * time.Hour)})
	dConflict := insertDeadLetter(t, db, deadLetter{Group: "g1", Topic: "T", Class: "conflict", FirstSeen: t0.Add(3 * time.Hour)})
	eReplayed := insertDeadLetter(t, db, deadLetter{Group: "g1", Topic: "T", Status: "REPLAYED", FirstSeen: t0})
	insertDeadLetter(t, db, deadLetter{Group: "g1", Topic: "T", Status: "DISCARDED", FirstSeen: t0})
	fOther := insertDeadLetter(t, db, deadLetter{Group: "g2", Topic: "U", FirstSeen: t0})
	r := newReplayer(t, replay.Config{DB: db})
	ctx := context.Background()
	ids := func(p replay.Plan) []int64 {
		var out []int64
		for _, c := range p.Candidates {
			out = append(out, c.DeadLetterID)
		}
		return out
	}
	for name, tc := range map[string]struct {
		sel  replay.Selector
		want []int64
	}{
		"group":            {replay.Selector{ConsumerGroup: "g1"}, []int64{a, b, cRedacted, dConflict}},
		"include replayed": {replay.Selector{ConsumerGroup: "g1", IncludeReplayed: true}, []int64{a, b, cRedacted, dConflict, eReplayed}},
		"ids":              {replay.Selector{IDs: []int64{a, fOther, eReplayed}}, []int64{a, fOther}},
		"type":             {replay.Selector{EventType: "OrderShipped"}, []int64{b}},
		"key":              {replay.Selector{BusinessKey: "k1"}, []int64{a}},
		"class":            {replay.Selector{ErrorClass: "data"}, []int64{b}},
		"topic":            {replay.Selector{Topic: "U"}, []int64{fOther}},
		"time range":       {replay.Selector{Since: t0.Add(time.Hour), Until: t0.Add(3 * time.Hour)}, []int64{b, cRedacted}},
		"limit":            {replay.Selector{ConsumerGroup: "g1", Limit: 2}, []int64{a, b}},
	} {
		p, err := r.DryRun(ctx, tc.sel)
		require.NoError(t, err, name)
		require.Equal(t, tc.want, ids(p), name)
	}
	p, err := r.DryRun(ctx, replay.Selector{ConsumerGroup: "g1"})
	require.NoError(t, err)
	require.Equal(t, 2, p.Replay)
	require.Equal(t, 2, p.Skip)
	require.Equal(t, "payload was redacted when parked", p.Candidates[2].SkipReason)
	require.Contains(t, p.Candidates[3].SkipReason, "conflict")
	require.Equal(t, 7, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_dead_letter"), "dry run writes nothing")
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_replay_audit"))
}

func TestRequestValidation(t *testing.T) {
	t.Parallel()
	r, err := replay.New(replay.Config{DB: sqlx.NewDb(nil, "mysql")})
	require.NoError(t, err)
	_, err = r.Replay(context.Background(), replay.Request{Selector: replay.Selector{ConsumerGroup: "g"}, Reason: "x"})
	require.ErrorIs(t, err, replay.ErrRequest, "operator required")
	_, err = r.Replay(context.Background(), replay.Request{Operator: "o", Reason: "x"})
	require.ErrorIs(t, err, replay.ErrRequest, "an empty selector is refused")
	_, err = r.Replay(context.Background(), replay.Request{Selector: replay.Selector{ConsumerGroup: "g"}, Operator: "o", Reason: "x"})
	require.ErrorIs(t, err, replay.ErrNotStarted)
	_, err = replay.New(replay.Config{})
	require.ErrorIs(t, err, replay.ErrConfig)
	_, err = replay.New(replay.Config{DB: sqlx.NewDb(nil, "mysql"), TablePrefix: "bad-prefix;"})
	require.ErrorIs(t, err, replay.ErrConfig)
	require.Error(t, r.Start(context.Background()), "no name server")
	require.NoError(t, r.Close())
	require.NoError(t, r.Close(), "idempotent")
	require.ErrorIs(t, r.Start(context.Background()), replay.ErrClosed)
	require.Equal(t, 10.0, r.Config().Rate)
	require.Equal(t, 10, r.Config().Batch)
}
