package schema_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
)

// legacyOwners are the version tables and placeholders of the release
// before the single plan (v0 main, f53b9c9): each owner ran its own
// migrations and kept its own <prefix><owner>_schema table.
var legacyOwners = []struct {
	dir, legacy string
	names       func(d, prefix string) (fs.FS, map[string]string, error)
}{
	{"txlog", "txlog_schema", txlog.Migrations},
	{"outbox", "outbox_schema", outbox.Migrations},
	{"consumer", "consumer_schema", consumer.Migrations},
	{"replay", "replay_schema", replay.Migrations},
}

// TestMigrateAllUpgradesAPerOwnerDatabase builds a database the way the
// previous release left it (its DDL, its four version tables, a row of
// data), then runs MigrateAll: the data survives, every owner's applied
// versions are adopted into the one version table without being run again,
// and a second run is a no-op. It runs on MariaDB only, by nature: the
// previous release supported no other database, so no PostgreSQL database
// was ever laid out that way.
func TestMigrateAllUpgradesAPerOwnerDatabase(t *testing.T) {
	db := testenv.MySQLDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := "u" + testenv.RandSuffix(6) + "_"

	legacyDDL, err := os.ReadFile(filepath.Join("testdata", "legacy_version_table.sql"))
	require.NoError(t, err)
	for _, o := range legacyOwners {
		files, err := filepath.Glob(filepath.Join("..", o.dir, "migrations", "mysql", "*.sql"))
		require.NoError(t, err)
		require.NotEmpty(t, files, o.dir)
		_, names, err := o.names("mysql", prefix)
		require.NoError(t, err)
		var pairs []string
		for k, v := range names {
			pairs = append(pairs, k, v)
		}
		fill := strings.NewReplacer(pairs...)
		for _, f := range files {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			for _, stmt := range splitSQL(fill.Replace(string(b))) {
				_, err := db.ExecContext(ctx, stmt)
				require.NoError(t, err, "%s: %s", f, stmt)
			}
		}
		vt := prefix + o.legacy
		_, err = db.ExecContext(ctx, strings.ReplaceAll(string(legacyDDL), "{{table}}", vt))
		require.NoError(t, err)
		for _, f := range files {
			_, err = db.ExecContext(ctx, "INSERT INTO "+vt+" (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6))",
				versionOf(t, f), filepath.Base(f))
			require.NoError(t, err)
		}
	}
	// A row the old release wrote.
	_, err = db.ExecContext(ctx, "INSERT INTO "+prefix+"txlog (event_id, producer_group, topic, tags, msg_keys, event_type, state,"+
		" payload, payload_hash, business_key, created_at, resolved_at, resolved_by) VALUES"+
		" ('legacy-1', 'g', 't', '', '', 'E', 'COMMITTED', 'p', 'h', 'k', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 'local_commit')")
	require.NoError(t, err)

	require.NoError(t, schema.MigrateAll(ctx, db, prefix))

	var n int
	require.NoError(t, db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+prefix+"txlog WHERE event_id = 'legacy-1'"))
	require.Equal(t, 1, n, "the old release's rows survive the upgrade")
	var adopted []struct {
		Part    string `db:"part"`
		Version int    `db:"version"`
	}
	require.NoError(t, db.SelectContext(ctx, &adopted, "SELECT part, version FROM "+prefix+schema.VersionTable+" ORDER BY part, version"))
	got := map[string]int{}
	for _, a := range adopted {
		got[a.Part]++
	}
	for _, p := range schema.PartNames() {
		require.Positive(t, got[p], "part %s adopted", p)
	}
	// Every version the old tables recorded is in the new table once.
	var legacyTotal int
	for _, o := range legacyOwners {
		var c int
		require.NoError(t, db.GetContext(ctx, &c, "SELECT COUNT(*) FROM "+prefix+o.legacy))
		legacyTotal += c
	}
	require.Equal(t, legacyTotal, len(adopted))

	require.NoError(t, schema.MigrateAll(ctx, db, prefix), "a second run is a no-op")
	require.NoError(t, db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+prefix+schema.VersionTable))
	require.Equal(t, len(adopted), n)
}

func versionOf(t *testing.T, file string) int {
	t.Helper()
	num, _, ok := strings.Cut(filepath.Base(file), "_")
	require.True(t, ok, file)
	v := 0
	for _, c := range num {
		require.True(t, c >= '0' && c <= '9', file)
		v = v*10 + int(c-'0')
	}
	return v
}

// splitSQL splits a migration file the way the old runner did: comment
// and blank lines dropped, a statement ending with a line ending in ';'.
func splitSQL(src string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(src, "\n") {
		tl := strings.TrimSpace(line)
		if tl == "" || strings.HasPrefix(tl, "--") {
			continue
		}
		cur.WriteString(line + "\n")
		if strings.HasSuffix(tl, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
