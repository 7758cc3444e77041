package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
)

// TestMigratePrint: --print writes the files of schema.Files without a
// database, to stdout or into a directory where a later run adds only the
// missing steps, numbered after what is there; the dialect comes from
// --dialect or the DSN's form, never with the DSN's password in sight.
func TestMigratePrint(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-pw"
	r := runCLI(nil, "migrate", "--print", "--dialect", "mysql", "--components", "txlog", "--table-prefix", "svc_")
	require.Equal(t, 0, r.code, r.stderr)
	want, err := schema.Files(schema.FilesOptions{Dialect: "mysql", Options: schema.Options{Prefix: "svc_", Components: []schema.Component{schema.TxLog}}})
	require.NoError(t, err)
	require.Len(t, want, 1)
	require.Equal(t, "-- ==== "+want[0].Name+"\n"+want[0].SQL+"\n", r.stdout)

	// The dialect of a DSN, which is never printed.
	env := map[string]string{"RMQTX_DSN": "postgres://app:" + secret + "@127.0.0.1:1/app"}
	r = runCLI(env, "migrate", "--print", "--format", "goose", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "TIMESTAMPTZ(6)")
	require.Contains(t, r.stdout, "-- +goose Up")
	require.NotContains(t, r.stdout+r.stderr, secret)
	r = runCLI(env, "migrate", "-h")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stderr, "-print")
	require.NotContains(t, r.stdout+r.stderr, secret)

	dir := filepath.Join(t.TempDir(), "migrations")
	r = runCLI(nil, "migrate", "--print", "--dialect", "postgres", "--format", "atlas", "--components", "txlog", "--out", dir)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "atlas migrate hash")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "00000000000002_orders.sql"), []byte("SELECT 1;\n"), 0o644))
	r = runCLI(nil, "migrate", "--print", "--dialect", "postgres", "--format", "atlas", "--components", "txlog,consumer", "--out", dir)
	require.Equal(t, 0, r.code, r.stderr)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	require.Equal(t, []string{"00000000000001_rmqtx_txlog_001_create_txlog.sql", "00000000000002_orders.sql",
		"00000000000003_rmqtx_consumer_001_consumer.sql", "00000000000004_rmqtx_consumer_002_consume_window.sql"}, names,
		"the consumer's steps come after the service's own")
	r = runCLI(nil, "migrate", "--print", "--dialect", "postgres", "--format", "atlas", "--components", "consumer", "--out", dir)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "nothing to write")

	for _, args := range [][]string{
		{"migrate", "--print"},                        // no dialect, no DSN
		{"migrate", "--print", "--dialect", "oracle"}, // unknown dialect
		{"migrate", "--print", "--dialect", "mysql", "--format", "flyway"},
		{"migrate", "--components", "txlog,audit"},        // unknown component
		{"migrate", "--format", "goose"},                  // --format without --print
		{"migrate", "--print", "--dialect", "mysql", "x"}, // no arguments
	} {
		e := env
		if len(args) == 2 {
			e = nil // no DSN to take the dialect from
		}
		r := runCLI(e, args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
		require.NotContains(t, r.stdout+r.stderr, secret)
	}
}

// TestMigrateComponentsFlag: --components migrates only the tables of the
// components named, and a later run with more adds theirs.
func TestMigrateComponentsFlag(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		env := map[string]string{"RMQTX_DSN": cliDSN(t, db), "RMQTX_TABLE_PREFIX": "cli_"}
		r := runCLI(env, "migrate", "--components", "outbox")
		require.Equal(t, 0, r.code, r.stderr)
		require.Equal(t, "migrated outbox\n", r.stdout)
		require.Equal(t, []string{"cli_outbox", "cli_schema_migrations"}, cliTables(t, db, "cli_"))
		r = runCLI(env, "migrate", "--components", "replay,outbox", "--json")
		require.Equal(t, 0, r.code, r.stderr)
		require.JSONEq(t, `{"migrated":["outbox","consumer","replay"]}`, r.stdout)
		want, err := schema.Options{Prefix: "cli_", Components: []schema.Component{schema.Outbox, schema.Replay}}.Tables()
		require.NoError(t, err)
		require.ElementsMatch(t, append(want, "cli_schema_migrations"), cliTables(t, db, "cli_"))
	})
}

func cliTables(t *testing.T, db *sqlx.DB, prefix string) []string {
	t.Helper()
	cur := "DATABASE()"
	if db.DriverName() != "mysql" {
		cur = "current_schema()"
	}
	var names []string
	require.NoError(t, db.SelectContext(context.Background(), &names, "SELECT table_name FROM information_schema.tables WHERE table_schema = "+cur+" ORDER BY table_name"))
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}
