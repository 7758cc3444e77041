package archive_test

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/archive"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
)

// fixture is one row of the status matrix and whether archival may remove it.
type fixture struct {
	table, key string
	remove     bool
}

func migrateAll(t *testing.T, db *sqlx.DB) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
}

// seed writes every status of every table, old (400 days) and young (now),
// and returns what archival with the default retentions may remove.
func seed(t *testing.T, db *sqlx.DB, now time.Time) []fixture {
	t.Helper()
	old, young := now.Add(-400*24*time.Hour), now.Add(-time.Minute)
	ages := map[string]time.Time{"old": old, "young": young}
	var fx []fixture
	exec := func(q string, args ...any) {
		t.Helper()
		_, err := db.Exec(db.Rebind(q), args...)
		require.NoError(t, err)
	}
	for _, ageName := range []string{"old", "young"} {
		at := ages[ageName]
		// txlog: every row is decided; an unknown state (a future in-flight
		// state) must never be removed either.
		for _, st := range []string{"COMMITTED", "ROLLED_BACK", "PENDING"} {
			id := "tx-" + st + "-" + ageName
			exec(`INSERT INTO rmqtx_txlog (event_id, state, created_at, resolved_at, resolved_by) VALUES (?, ?, ?, ?, 'LOCAL_COMMIT')`, id, st, at, at)
			fx = append(fx, fixture{"rmqtx_txlog", id, ageName == "old" && st != "PENDING"})
		}
		// outbox: only SENT and DEAD are terminal.
		for _, st := range []string{"PENDING", "SENDING", "RETRY", "SENT", "DEAD"} {
			id := "ob-" + st + "-" + ageName
			var lease any
			if st == "SENDING" {
				lease = at // an expired lease is still in flight until taken over
			}
			exec(`INSERT INTO rmqtx_outbox (event_id, event_type, destination, payload, status, owner_token, lease_until, retry_count,
				next_retry_at, created_at, sent_at, updated_at) VALUES (?, 'T', 'topic', 'p', ?, 'owner', ?, 3, ?, ?, ?, ?)`,
				id, st, lease, at, at, at, at)
			fx = append(fx, fixture{"rmqtx_outbox", id, ageName == "old" && (st == "SENT" || st == "DEAD")})
		}
		// consume log: SUCCESS and STALE are terminal dedup records.
		for _, st := range []string{"SUCCESS", "STALE", "PROCESSING"} {
			id := "cl-" + st + "-" + ageName
			exec(`INSERT INTO rmqtx_consume_log (consumer_group, event_id, event_type, request_hash, status, first_received_at, updated_at)
				VALUES ('g', ?, 'T', REPEAT('a', 64), ?, ?, ?)`, id, st, at, at)
			fx = append(fx, fixture{"rmqtx_consume_log", "g/" + id, ageName == "old" && st != "PROCESSING"})
		}
		// consume attempts (retries in progress) and version state: never.
		id := "ca-" + ageName
		exec(`INSERT INTO rmqtx_consume_attempt (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at)
			VALUES ('g', ?, 2, 'transient', 'db down', ?, ?)`, id, at, at)
		fx = append(fx, fixture{"rmqtx_consume_attempt", "g/" + id, false})
		exec(`INSERT INTO rmqtx_aggregate_version (consumer_group, aggregate_type, aggregate_id, last_applied_version, last_event_id, updated_at)
			VALUES ('g', 'Order', ?, 3, 'e', ?)`, "agg-"+ageName, at)
		fx = append(fx, fixture{"rmqtx_aggregate_version", "g/agg-" + ageName, false})
		// dead letters: PARKED never; REPLAYED/DISCARDED after resolution.
		for _, st := range []string{"PARKED", "REPLAYED", "DISCARDED"} {
			var resolved any
			if st != "PARKED" {
				resolved = at
			}
			ev := "dl-" + st + "-" + ageName
			exec(`INSERT INTO rmqtx_dead_letter (consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key,
				error_class, error_text, request_hash, properties, reconsume_times, status, first_seen_at, last_seen_at, replayed_at, resolved_at)
				VALUES ('g', 'topic', 0, 0, 'm', ?, 'T', '', 'permanent', 'e', REPEAT('a', 64), '{}', 0, ?, ?, ?, ?, ?)`,
				ev, st, at, at, resolved, resolved)
			fx = append(fx, fixture{"rmqtx_dead_letter", ev, ageName == "old" && st != "PARKED"})
		}
	}
	// More old SENT rows than one batch holds.
	for i := range 5 {
		id := fmt.Sprintf("ob-SENT-old-%d", i)
		exec(`INSERT INTO rmqtx_outbox (event_id, event_type, destination, payload, status, retry_count, next_retry_at, created_at, sent_at, updated_at)
			VALUES (?, 'T', 'topic', 'p', 'SENT', 0, ?, ?, ?, ?)`, id, old, old, old, old)
		fx = append(fx, fixture{"rmqtx_outbox", id, true})
	}
	// Resolved long ago but delivered again recently: still in use.
	exec(`INSERT INTO rmqtx_dead_letter (consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key,
		error_class, error_text, request_hash, properties, reconsume_times, status, first_seen_at, last_seen_at, resolved_at)
		VALUES ('g', 'topic', 0, 0, 'm', 'dl-DISCARDED-redelivered', 'T', '', 'permanent', 'e', REPEAT('a', 64), '{}', 0, 'DISCARDED', ?, ?, ?)`,
		old, young, old)
	fx = append(fx, fixture{"rmqtx_dead_letter", "dl-DISCARDED-redelivered", false})
	// SENT long after it was created: the clock starts at the last update.
	exec(`INSERT INTO rmqtx_outbox (event_id, event_type, destination, payload, status, retry_count, next_retry_at, created_at, sent_at, updated_at)
		VALUES ('ob-SENT-recently', 'T', 'topic', 'p', 'SENT', 0, ?, ?, ?, ?)`, old, old, young, young)
	fx = append(fx, fixture{"rmqtx_outbox", "ob-SENT-recently", false})
	return fx
}

// keys lists the keys present in each table.
func keys(t *testing.T, db *sqlx.DB) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for table, q := range map[string]string{
		"rmqtx_txlog":             "SELECT event_id FROM rmqtx_txlog",
		"rmqtx_outbox":            "SELECT event_id FROM rmqtx_outbox",
		"rmqtx_consume_log":       "SELECT CONCAT(consumer_group, '/', event_id) FROM rmqtx_consume_log",
		"rmqtx_consume_attempt":   "SELECT CONCAT(consumer_group, '/', event_id) FROM rmqtx_consume_attempt",
		"rmqtx_aggregate_version": "SELECT CONCAT(consumer_group, '/', aggregate_id) FROM rmqtx_aggregate_version",
		"rmqtx_dead_letter":       "SELECT event_id FROM rmqtx_dead_letter",
	} {
		var ks []string
		require.NoError(t, db.Select(&ks, q))
		sort.Strings(ks)
		out[table] = ks
	}
	return out
}

func want(fx []fixture, removed bool) map[string][]string {
	out := map[string][]string{}
	for _, f := range fx {
		if f.remove == removed {
			out[f.table] = append(out[f.table], f.key)
		}
	}
	for k := range out {
		sort.Strings(out[k])
	}
	return out
}

func drop(m map[string][]string) map[string][]string {
	for k, v := range m {
		if len(v) == 0 {
			delete(m, k)
		}
	}
	return m
}

// Archival removes exactly the terminal rows past retention, across every
// status of every table, in bounded batches; a dry run counts the same rows
// and removes nothing; in-flight rows are never touched.
func TestArchiveNeverRemovesInFlightRows(t *testing.T) {
	t.Parallel()
	for _, move := range []bool{false, true} {
		t.Run(fmt.Sprintf("move=%v", move), func(t *testing.T) {
			t.Parallel()
			testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) { testArchive(t, db, move) })
		})
	}
}

func testArchive(t *testing.T, db *sqlx.DB, move bool) {
	migrateAll(t, db)
	now := time.Now().UTC()
	fx := seed(t, db, now)
	before := keys(t, db)
	ctx := context.Background()
	a, err := archive.New(archive.Config{DB: db, Batch: 2, Move: move})
	require.NoError(t, err)

	plan, err := a.Plan(ctx)
	require.NoError(t, err)
	require.Equal(t, before, keys(t, db), "a dry run removes nothing")
	eligible := map[string]int64{}
	for _, r := range plan.Rules {
		eligible[r.Table] += r.Eligible
		require.Zero(t, r.Removed)
	}
	wantRemoved := want(fx, true)
	for table, ks := range wantRemoved {
		require.Equal(t, int64(len(ks)), eligible[table], "dry-run count for %s", table)
	}

	rep, err := a.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, drop(want(fx, false)), drop(keys(t, db)), "exactly the in-flight, young and non-terminal rows remain")
	var total int64
	multi := false
	for _, r := range rep.Rules {
		multi = multi || r.Batches > 1
		total += r.Removed
		if r.Removed > 2 {
			require.Greater(t, r.Batches, 1, "bounded batches for %s", r.Table)
		}
	}
	n := 0
	for _, ks := range wantRemoved {
		n += len(ks)
	}
	require.Equal(t, int64(n), total)
	require.True(t, multi, "some rule needed several batches")
	t.Logf("move=%v: %d rows seeded, %d removed in batches of 2, %d kept", move, len(fx), total, len(fx)-n)
	if move {
		for table, ks := range wantRemoved {
			var got []string
			col := "event_id"
			if table == "rmqtx_consume_log" {
				col = "CONCAT(consumer_group, '/', event_id)"
			}
			require.NoError(t, db.Select(&got, "SELECT "+col+" FROM "+table+"_archive"))
			sort.Strings(got)
			require.Equal(t, ks, got, "archived copy of %s", table)
		}
	}
	again, err := a.Run(ctx)
	require.NoError(t, err)
	require.Zero(t, again.Removed(), "idempotent")
}

func TestArchiveConfig(t *testing.T) {
	t.Parallel()
	db := sqlx.NewDb(nil, "mysql")
	_, err := archive.New(archive.Config{})
	require.ErrorIs(t, err, archive.ErrConfig)
	_, err = archive.New(archive.Config{DB: db, TxlogRetention: time.Hour})
	require.ErrorIs(t, err, archive.ErrRetentionTooShort)
	_, err = archive.New(archive.Config{DB: db, ConsumeLogRetention: 24 * time.Hour})
	require.ErrorIs(t, err, archive.ErrRetentionTooShort)
	_, err = archive.New(archive.Config{DB: db, ConsumeLogRetention: 10 * 24 * time.Hour})
	require.ErrorIs(t, err, archive.ErrRetentionTooShort, "consume log shorter than the dead-letter (replay) window")
	_, err = archive.New(archive.Config{DB: db, Tables: []archive.Table{"consume_attempt"}})
	require.ErrorIs(t, err, archive.ErrConfig, "in-progress tables are not archivable")
	_, err = archive.New(archive.Config{DB: db, TablePrefix: "x;drop"})
	require.ErrorIs(t, err, archive.ErrConfig)
	a, err := archive.New(archive.Config{DB: db, TxlogRetention: time.Second, AllowShortRetention: true})
	require.NoError(t, err)
	require.Equal(t, 500, a.Config().Batch)
	require.Equal(t, archive.DefaultConsumeLogRetention, a.Config().ConsumeLogRetention)
}

// RowsPerSecond paces a run: removing rows past one batch's burst takes at
// least the time the rate allows, and removes the same rows.
func TestArchivePacedByRowsPerSecond(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		migrateAll(t, db)
		now := time.Now().UTC()
		old := now.Add(-400 * 24 * time.Hour)
		for i := range 40 {
			_, err := db.Exec(db.Rebind(`INSERT INTO rmqtx_txlog (event_id, state, created_at, resolved_at, resolved_by) VALUES (?, 'COMMITTED', ?, ?, 'LOCAL_COMMIT')`),
				fmt.Sprintf("paced-%02d", i), old, old)
			require.NoError(t, err)
		}
		a, err := archive.New(archive.Config{DB: db, Batch: 10, RowsPerSecond: 100, Tables: []archive.Table{archive.Txlog}})
		require.NoError(t, err)
		start := time.Now()
		rep, err := a.Run(context.Background())
		require.NoError(t, err)
		took := time.Since(start)
		require.Equal(t, int64(40), rep.Removed())
		// The first batch is the burst; the next three wait 100 ms each, and
		// a last, empty batch confirms nothing is left (another 100 ms).
		require.GreaterOrEqual(t, took, 300*time.Millisecond, "paced at 100 rows/s in batches of 10")
		require.False(t, rep.Rules[0].More)
		require.Equal(t, int64(40), rep.Rules[0].Eligible)

		// A pace that would outlast the caller's deadline stops at once,
		// as a deadline error, with rows left.
		for i := range 20 {
			_, err := db.Exec(db.Rebind(`INSERT INTO rmqtx_txlog (event_id, state, created_at, resolved_at, resolved_by) VALUES (?, 'COMMITTED', ?, ?, 'LOCAL_COMMIT')`),
				fmt.Sprintf("slow-%02d", i), old, old)
			require.NoError(t, err)
		}
		slow, err := archive.New(archive.Config{DB: db, Batch: 10, RowsPerSecond: 1, Tables: []archive.Table{archive.Txlog}})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		rep, err = slow.Run(ctx)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, int64(10), rep.Removed(), "the first batch is the burst")
		require.True(t, rep.Rules[0].More)
	})
}
