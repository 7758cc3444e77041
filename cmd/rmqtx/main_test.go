package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

type result struct {
	code           int
	stdout, stderr string
}

func runCLI(env map[string]string, args ...string) result {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errb)
	return result{code, out.String(), errb.String()}
}

func golden(t *testing.T, name string, r result) {
	t.Helper()
	got := fmt.Sprintf("exit: %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./cmd/rmqtx -update to create %s", path)
	require.Equal(t, string(want), got, "golden %s (go test ./cmd/rmqtx -update rewrites it)", path)
}

const now = "2025-06-01T12:00:00Z"

// cliDSN is the DSN the CLI gets for db's database: the MySQL form, or a
// postgres:// URL.
func cliDSN(t *testing.T, db *sqlx.DB) string {
	t.Helper()
	name := testenv.DBName(t, db)
	if db.DriverName() == "mysql" {
		return testenv.Integration(t).DSN(name)
	}
	u, err := url.Parse(testenv.PGDSN())
	require.NoError(t, err)
	require.Contains(t, []string{"postgres", "postgresql"}, u.Scheme, "%s must be a postgres:// URL for the CLI tests", testenv.EnvPGDSN)
	u.Path = "/" + name
	return u.String()
}

// pgTimeLiteral matches the fixture's time literals.
var pgTimeLiteral = regexp.MustCompile(`'(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?)'`)

// seedFixture writes a fixed, known set of rows (fixed ids and times) so the
// output is the same on every run, and on both databases: the statements
// are the same but for the digest function and, on PostgreSQL, an explicit
// UTC offset on each time literal (a TIMESTAMPTZ literal without one is in
// the session's time zone).
func seedFixture(t *testing.T, db *sqlx.DB) {
	t.Helper()
	d := dialect.Must(db)
	sha := func(lit string) string { return d.SHA256Hex(lit) }
	stmts := []string{
		`INSERT INTO rmqtx_txlog (event_id, producer_group, topic, tags, msg_keys, event_type, state, payload, payload_hash, properties,
			business_key, created_at, resolved_at, resolved_by) VALUES ('0197a000-0000-7000-8000-000000000001', 'orders-tx', 'orders', 'paid',
			'0197a000-0000-7000-8000-000000000001 order-1', 'OrderPaid', 'COMMITTED', '{"order":"order-1","card":"4111111111111111"}',
			'9f2c', '{}', 'order-1', '2025-06-01 11:00:00', '2025-06-01 11:00:00.250', 'LOCAL_COMMIT')`,
		`INSERT INTO rmqtx_outbox (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, destination, message_key, payload,
			status, retry_count, next_retry_at, created_at, updated_at, last_error_code, last_error_message)
			VALUES ('0197a000-0000-7000-8000-000000000002', 'Order', 'order-2', 3, 'OrderShipped', 'shipping', 'order-2',
			'{"order":"order-2","address":"1 Secret Lane"}', 'RETRY', 4, '2025-06-01 12:05:00', '2025-06-01 11:30:00', '2025-06-01 11:55:00',
			'TIMEOUT', 'send timed out')`,
		`INSERT INTO rmqtx_outbox (event_id, event_type, destination, payload, status, retry_count, next_retry_at, created_at, sent_at, updated_at)
			VALUES ('0197a000-0000-7000-8000-000000000003', 'OrderPaid', 'orders', 'x', 'SENT', 0, '2025-05-01 00:00:00', '2025-05-01 00:00:00',
			'2025-05-01 00:00:01', '2025-05-01 00:00:01')`,
		`INSERT INTO rmqtx_consume_log (consumer_group, event_id, event_type, request_hash, status, result_ref, first_received_at, updated_at)
			VALUES ('points', '0197a000-0000-7000-8000-000000000001', 'OrderPaid', REPEAT('a', 64), 'SUCCESS', 'points-tx-17',
			'2025-06-01 11:00:01', '2025-06-01 11:00:01')`,
		`INSERT INTO rmqtx_consume_attempt (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at)
			VALUES ('sms', '0197a000-0000-7000-8000-000000000001', 3, 'transient', 'sms gateway 503', '2025-06-01 11:00:02', '2025-06-01 11:10:00')`,
		`INSERT INTO rmqtx_dead_letter (id, consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key, error_class,
			error_text, payload, request_hash, properties, reconsume_times, status, first_seen_at, last_seen_at)
			VALUES (1, 'search', 'orders', 2, 41, 'AC1100010000', '0197a000-0000-7000-8000-000000000001', 'OrderPaid', 'order-1', 'data',
			'cannot decode field amount', '{"order":"order-1","card":"4111111111111111"}', ` + sha(`'{"order":"order-1","card":"4111111111111111"}'`) + `,
			'{"RMQTX_EVENT_ID":"0197a000-0000-7000-8000-000000000001","RMQTX_EVENT_TYPE":"OrderPaid","KEYS":"0197a000-0000-7000-8000-000000000001"}',
			0, 'PARKED', '2025-06-01 11:00:03', '2025-06-01 11:00:03')`,
		`INSERT INTO rmqtx_dead_letter (id, consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key, error_class,
			error_text, payload, request_hash, existing_hash, properties, reconsume_times, status, first_seen_at, last_seen_at)
			VALUES (2, 'points', 'orders', 0, 9, 'AC1100010001', '0197a000-0000-7000-8000-000000000004', 'OrderPaid', 'order-4', 'conflict',
			'same event id, different payload', 'v2', REPEAT('b', 64), REPEAT('c', 64), '{}', 0, 'PARKED', '2025-06-01 10:00:00', '2025-06-01 10:00:00')`,
		`INSERT INTO rmqtx_dead_letter (id, consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key, error_class,
			error_text, payload, request_hash, properties, reconsume_times, status, first_seen_at, last_seen_at, replay_count, replayed_at, resolved_at,
			resolution_note) VALUES (3, 'points', 'orders', 0, 10, 'AC1100010002', '0197a000-0000-7000-8000-000000000005', 'OrderPaid', 'order-5',
			'permanent', 'order closed', 'p', ` + sha(`'p'`) + `, '{}', 2, 'REPLAYED', '2025-04-01 10:00:00', '2025-04-01 10:00:00', 1,
			'2025-04-02 10:00:00', '2025-04-02 10:00:00', 'replayed by alice (audit 1)')`,
		`INSERT INTO rmqtx_replay_audit (id, operator, reason, scope, rate_limit, batch_size, selected, sent, result, started_at, finished_at)
			VALUES (1, 'alice', 'fixed the points handler', '{"ids":[3]}', 5, 10, 1, 1, 'COMPLETED', '2025-04-02 10:00:00', '2025-04-02 10:00:01')`,
		`INSERT INTO rmqtx_replay_audit_item (audit_id, dead_letter_id, consumer_group, event_id, topic, result, msg_id, at)
			VALUES (1, 3, 'points', '0197a000-0000-7000-8000-000000000005', 'orders', 'sent', 'AC11000100FF', '2025-04-02 10:00:00.500')`,
	}
	for _, s := range stmts {
		if d.Name() == "postgres" {
			s = pgTimeLiteral.ReplaceAllString(s, "'$1+00'")
		}
		_, err := db.Exec(s)
		require.NoError(t, err, s)
	}
}

// TestGolden runs every command on a fixed fixture, once per database,
// against the same golden files: the operator sees the same output on
// MySQL and on PostgreSQL.
func TestGolden(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testGolden)
}

func testGolden(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	env := map[string]string{"RMQTX_DSN": cliDSN(t, db)}
	r := runCLI(env, "migrate")
	require.Equal(t, 0, r.code, r.stderr)
	golden(t, "migrate", r)
	r = runCLI(env, "migrate", "--json")
	require.Equal(t, 0, r.code, "migrate is idempotent: %s", r.stderr)
	seedFixture(t, db)

	id := "0197a000-0000-7000-8000-000000000001"
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"inspect", []string{"inspect", id}, 1}, // a PARKED dead letter and a retrying group need attention
		{"inspect_json", []string{"inspect", "--json", id}, 1},
		{"inspect_business_key", []string{"inspect", "--business-key", "order-2"}, 1}, // outbox still RETRY
		{"inspect_not_found", []string{"inspect", "no-such-event"}, 1},
		{"inspect_clear_of_secrets", []string{"inspect", "--redact-prefix", "0", id}, 1},
		{"stuck", []string{"stuck", "--older-than", "30m"}, 1},
		{"stuck_none", []string{"stuck", "--older-than", "1000h"}, 0},
		{"dead_list", []string{"dead", "list"}, 1},
		{"dead_list_replayed_json", []string{"dead", "list", "--status", "REPLAYED", "--json"}, 0},
		{"dead_show", []string{"dead", "show", "1"}, 0},
		{"dead_show_missing", []string{"dead", "show", "99"}, 1},
		{"replay_dry_run", []string{"replay", "--dry-run", "--topic", "orders"}, 0},
		{"replay_no_reason", []string{"replay", "--group", "points", "--operator", "bob"}, 2},
		{"replay_no_selector", []string{"replay", "--dry-run"}, 2},
		{"archive_dry_run", []string{"archive", "--dry-run"}, 0},
		{"archive_too_short", []string{"archive", "--dry-run", "--consume-log-retention", "1h"}, 2},
		{"stats", []string{"stats"}, 0},
		{"no_args", nil, 2},
		{"unknown_command", []string{"frobnicate"}, 2},
		{"dead_no_sub", []string{"dead"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{}, tc.args...)
			if len(args) > 0 {
				args = append(args, "--now", now)
			}
			if tc.name == "no_args" || tc.name == "unknown_command" || tc.name == "dead_no_sub" {
				args = tc.args
			}
			r := runCLI(env, args...)
			require.Equal(t, tc.code, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			golden(t, tc.name, r)
			require.NotContains(t, r.stdout+r.stderr, "4111111111111111", "payload content is redacted")
			require.NotContains(t, r.stdout+r.stderr, "Secret Lane", "payload content is redacted")
		})
	}
	// Payloads are hidden unless the operator opts out, explicitly.
	r = runCLI(env, "inspect", "--redact-prefix", "8", "--now", now, id)
	require.Contains(t, r.stdout, `{"order"… <45 bytes>`, r.stderr)
	require.NotContains(t, r.stdout, "4111111111111111")
	r = runCLI(env, "dead", "show", "--show-payload", "1")
	require.Contains(t, r.stdout, `{"order":"order-1","card":"4111111111111111"}`, r.stderr)
	r = runCLI(env, "config", "--show-payload")
	require.Contains(t, r.stdout, "shown in clear")

	// Archive for real removes the one old SENT outbox row only.
	r = runCLI(env, "archive", "--now", now, "--outbox-retention", "24h")
	require.Equal(t, 0, r.code, r.stderr)
	var left int
	require.NoError(t, db.Get(&left, "SELECT COUNT(*) FROM rmqtx_outbox"))
	require.Equal(t, 1, left)
}

// A DSN password is never printed: not by config, not in errors.
func TestPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	const pw = "S3cr3t-Pa55"
	env := map[string]string{"RMQTX_DSN": "rmqtx:" + pw + "@tcp(127.0.0.1:1)/rmqtx_db", "RMQTX_NAMESRV": "127.0.0.1:9876"}
	r := runCLI(env, "config")
	require.Equal(t, 0, r.code, r.stderr)
	golden(t, "config", r)
	for _, args := range [][]string{{"config", "--json"}, {"stats"}, {"inspect", "x"}, {"migrate"}, {"dead", "list"}, {"archive", "--dry-run"},
		{"replay", "--dry-run", "--group", "g"}, {"stats", "--dsn", "rmqtx:" + pw + "@tcp(127.0.0.1:1)/"}, {"stats", "--dsn", "rmqtx:" + pw + "@bogus("}} {
		r := runCLI(env, args...)
		require.NotContains(t, r.stdout+r.stderr, pw, "%v printed the password", args)
		if args[0] != "config" {
			require.Contains(t, []int{2, 3}, r.code, "%v: %s", args, r.stderr)
		}
	}
	// The same with a PostgreSQL DSN, URL and keyword/value.
	pgEnv := map[string]string{"RMQTX_DSN": "postgres://rmqtx:" + pw + "@127.0.0.1:1/rmqtx_db?sslmode=disable", "RMQTX_NAMESRV": "127.0.0.1:9876"}
	r = runCLI(pgEnv, "config")
	require.Equal(t, 0, r.code, r.stderr)
	golden(t, "config_postgres", r)
	for _, args := range [][]string{{"config", "--json"}, {"stats"}, {"inspect", "x"}, {"migrate"}, {"dead", "list"}, {"archive", "--dry-run"},
		{"replay", "--dry-run", "--group", "g"}, {"stats", "--dsn", "host=127.0.0.1 port=1 user=rmqtx password=" + pw + " dbname=d"},
		{"stats", "--dsn", "postgres://rmqtx:" + pw + "@127.0.0.1:x/d"}, {"stats", "--dsn", "host=127.0.0.1 port=x password='" + pw + "' dbname=d"}} {
		r := runCLI(pgEnv, append(args, "--timeout", "3s")...)
		require.NotContains(t, r.stdout+r.stderr, pw, "%v printed the password", args)
		if args[0] != "config" {
			require.Contains(t, []int{2, 3}, r.code, "%v: %s", args, r.stderr)
		}
	}
	r = runCLI(pgEnv, "stats", "--timeout", "3s")
	require.Equal(t, 3, r.code, "unreachable database is a runtime error")
	require.True(t, strings.HasPrefix(r.stderr, "rmqtx stats: connect to database rmqtx_db at 127.0.0.1:1 as rmqtx"), r.stderr)

	r = runCLI(map[string]string{"RMQTX_MYSQL_PASSWORD": pw, "RMQTX_MYSQL_DATABASE": "d", "RMQTX_MYSQL_ADDR": "127.0.0.1:1"}, "config")
	require.Equal(t, 0, r.code)
	require.NotContains(t, r.stdout, pw)
	require.Contains(t, r.stdout, "***")
	r = runCLI(map[string]string{"RMQTX_MYSQL_PASSWORD": pw, "RMQTX_MYSQL_DATABASE": "d", "RMQTX_MYSQL_ADDR": "127.0.0.1:1"}, "stats", "--timeout", "3s")
	require.Equal(t, 3, r.code, "unreachable database is a runtime error")
	require.NotContains(t, r.stdout+r.stderr, pw)
	require.True(t, strings.HasPrefix(r.stderr, "rmqtx stats: connect to database d at 127.0.0.1:1"), r.stderr)
}

// descRecorder is a Registerer that records the names of what registers.
type descRecorder struct{ names []string }

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 16)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqNameRE.FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1])
		}
	}
	return nil
}
func (d *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}
func (d *descRecorder) Unregister(prometheus.Collector) bool { return false }

// Every registered metric is documented in METRICS.md.
func TestMetricsDocumented(t *testing.T) {
	t.Parallel()
	rec := &descRecorder{}
	_, err := metrics.New(rec)
	require.NoError(t, err)
	require.NotEmpty(t, rec.names)
	doc, err := os.ReadFile("../../METRICS.md")
	require.NoError(t, err)
	for _, n := range rec.names {
		require.Contains(t, string(doc), "`"+n+"`", "METRICS.md documents %s", n)
	}
}
