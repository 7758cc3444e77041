package schema_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
)

// TestFilesNameAndNumberTheSteps: each format's names, the goose
// annotation, numbering after a directory's files, steps already there left
// out, and the argument errors.
func TestFilesNameAndNumberTheSteps(t *testing.T) {
	names := func(fs []schema.File) []string {
		out := make([]string, len(fs))
		for i, f := range fs {
			out[i] = f.Name
		}
		return out
	}
	all, err := schema.Files(schema.FilesOptions{Dialect: "mysql"})
	require.NoError(t, err)
	require.Equal(t, []string{
		"000001_rmqtx_txlog_001_create_txlog.up.sql",
		"000002_rmqtx_outbox_001_outbox.up.sql",
		"000003_rmqtx_consumer_001_consumer.up.sql",
		"000004_rmqtx_consumer_002_consume_window.up.sql",
		"000005_rmqtx_replay_001_replay_audit.up.sql",
	}, names(all), `"" is golang-migrate, every component, the default prefix`)
	for _, f := range all {
		require.Contains(t, f.SQL, "rmqtx_"+schema.VersionTable, "every file records its step")
		require.NotContains(t, f.SQL, "{{", "every placeholder is filled")
	}

	goose, err := schema.Files(schema.FilesOptions{Dialect: "postgres", Format: schema.Goose,
		Options: schema.Options{Prefix: "svc_", Components: []schema.Component{schema.Replay}}})
	require.NoError(t, err)
	require.Equal(t, []string{"00001_svc_consumer_001_consumer.sql", "00002_svc_consumer_002_consume_window.sql", "00003_svc_replay_001_replay_audit.sql"}, names(goose),
		"replay brings the consumer's dead letters")
	for _, f := range goose {
		require.True(t, strings.HasPrefix(f.SQL, "-- +goose Up\n"), f.Name)
	}
	require.Contains(t, goose[0].SQL, "CREATE TABLE IF NOT EXISTS svc_dead_letter (")

	atlas, err := schema.Files(schema.FilesOptions{Dialect: "mysql", Format: schema.Atlas,
		Options: schema.Options{Components: []schema.Component{schema.TxLog}}})
	require.NoError(t, err)
	require.Equal(t, []string{"00000000000001_rmqtx_txlog_001_create_txlog.sql"}, names(atlas))

	// A directory with the service's own files and the txlog step: the
	// consumer, added later, comes after everything there.
	later, err := schema.Files(schema.FilesOptions{Dialect: "mysql",
		Options:  schema.Options{Components: []schema.Component{schema.TxLog, schema.Consumer}},
		Existing: []string{"000001_users.up.sql", "000001_users.down.sql", "000007_rmqtx_txlog_001_create_txlog.up.sql", "000012_orders.up.sql", "README.md"}})
	require.NoError(t, err)
	require.Equal(t, []string{"000013_rmqtx_consumer_001_consumer.up.sql", "000014_rmqtx_consumer_002_consume_window.up.sql"}, names(later))
	none, err := schema.Files(schema.FilesOptions{Dialect: "mysql", Options: schema.Options{Components: []schema.Component{schema.TxLog}},
		Existing: []string{"000007_rmqtx_txlog_001_create_txlog.up.sql"}})
	require.NoError(t, err)
	require.Empty(t, none, "nothing new to write")

	for name, o := range map[string]schema.FilesOptions{
		"dialect":   {Dialect: "oracle"},
		"format":    {Dialect: "mysql", Format: "flyway"},
		"component": {Dialect: "mysql", Options: schema.Options{Components: []schema.Component{"audit"}}},
		"prefix":    {Dialect: "mysql", Options: schema.Options{Prefix: "bad-prefix"}},
	} {
		_, err := schema.Files(o)
		require.ErrorIs(t, err, schema.ErrConfig, name)
	}
	cs, err := schema.ParseComponents(" txlog, outbox ")
	require.NoError(t, err)
	require.Equal(t, []schema.Component{schema.TxLog, schema.Outbox}, cs)
	cs, err = schema.ParseComponents("all")
	require.NoError(t, err)
	require.Equal(t, schema.Components(), cs)
	_, err = schema.ParseComponents("txlog,nope")
	require.ErrorIs(t, err, schema.ErrConfig)
}

// TestFilesApplyLikeMigrate runs the files of every format with a plain
// client (database/sql, one Exec per file, in order: no rmqtx runner) under
// one prefix each, migrates another prefix with MigrateAll, and compares
// the two: the same tables, columns (type, nullability, default), indexes
// and version-table rows. MigrateAll then adopts the files' database: it
// runs no step again; and the files run on MigrateAll's database change
// nothing.
func TestFilesApplyLikeMigrate(t *testing.T) {
	testenv.EachDB(t, testFilesApplyLikeMigrate)
}

func testFilesApplyLikeMigrate(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d := dialect.Must(db).Name()
	plain := db.DB
	if d == "mysql" {
		// What golang-migrate, goose and Atlas need too: a file is one
		// multi-statement Exec.
		plain = testenv.MySQLVariant(t, db, func(c *mysql.Config) { c.MultiStatements = true }).DB
	}
	ref := "r" + testenv.RandSuffix(6) + "_"
	require.NoError(t, schema.MigrateAll(ctx, db, ref))
	want := describe(t, ctx, db, ref)
	require.NotEmpty(t, want)

	for _, format := range schema.Formats() {
		prefix := "f" + testenv.RandSuffix(6) + "_"
		files, err := schema.Files(schema.FilesOptions{Dialect: d, Format: format, Options: schema.Options{Prefix: prefix}})
		require.NoError(t, err)
		require.Len(t, files, len(schema.PartNames())+1, "one step per owner today, two for the consumer")
		for _, f := range files {
			_, err := plain.ExecContext(ctx, f.SQL)
			require.NoError(t, err, "%s %s", format, f.Name)
		}
		require.Equal(t, want, describe(t, ctx, db, prefix), "%s files make what MigrateAll makes", format)

		// Adoption: with every table but the version table gone, a step
		// run again would create its tables; none may come back.
		before := versionRows(t, ctx, db, prefix)
		tables, err := schema.Tables(prefix)
		require.NoError(t, err)
		for i := len(tables) - 1; i >= 0; i-- {
			_, err := db.ExecContext(ctx, "DROP TABLE "+tables[i])
			require.NoError(t, err)
		}
		require.NoError(t, schema.MigrateAll(ctx, db, prefix))
		require.Equal(t, []string{prefix + schema.VersionTable}, tablesWith(t, ctx, db, prefix), "%s: MigrateAll ran no step again", format)
		require.Equal(t, before, versionRows(t, ctx, db, prefix))
	}

	// The other way round: the files run on MigrateAll's database change
	// nothing (a team switching to its own tool).
	refRows := versionRows(t, ctx, db, ref)
	files, err := schema.Files(schema.FilesOptions{Dialect: d, Options: schema.Options{Prefix: ref}})
	require.NoError(t, err)
	for _, f := range files {
		_, err := plain.ExecContext(ctx, f.SQL)
		require.NoError(t, err, f.Name)
	}
	require.Equal(t, want, describe(t, ctx, db, ref))
	require.Equal(t, refRows, versionRows(t, ctx, db, ref))
}

// TestMigrateComponents: a service that migrates the transaction log only
// gets its table; adding the consumer later runs the consumer's steps only;
// asking for the replay audit brings the consumer's tables it refers to.
func TestMigrateComponents(t *testing.T) {
	testenv.EachDB(t, testMigrateComponents)
}

func testMigrateComponents(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := "c" + testenv.RandSuffix(6) + "_"
	only := func(cs ...schema.Component) schema.Options { return schema.Options{Prefix: prefix, Components: cs} }
	tablesOf := func(o schema.Options) []string {
		ts, err := o.Tables()
		require.NoError(t, err)
		return append(ts, prefix+schema.VersionTable)
	}

	require.NoError(t, schema.Migrate(ctx, db, only(schema.TxLog)))
	require.ElementsMatch(t, tablesOf(only(schema.TxLog)), tablesWith(t, ctx, db, prefix))
	require.ElementsMatch(t, []string{prefix + "txlog"}, tablesOf(only(schema.TxLog))[:1])
	txlogRows := versionRows(t, ctx, db, prefix)
	require.Len(t, txlogRows, 1)
	require.True(t, strings.HasPrefix(txlogRows[0], "txlog "), txlogRows[0])

	// Drop the log: if the second run ran the txlog's step again, the
	// table would come back.
	_, err := db.ExecContext(ctx, "DROP TABLE "+prefix+"txlog")
	require.NoError(t, err)
	require.NoError(t, schema.Migrate(ctx, db, only(schema.Consumer, schema.TxLog)))
	consumerTables, err := only(schema.Consumer).Tables()
	require.NoError(t, err)
	require.ElementsMatch(t, append(consumerTables, prefix+schema.VersionTable), tablesWith(t, ctx, db, prefix),
		"only the consumer's steps ran")
	rows := versionRows(t, ctx, db, prefix)
	require.Equal(t, txlogRows[0], rows[0], "the txlog's row is as the first run wrote it")
	require.Len(t, rows, 3, "the txlog's step and the consumer's two")

	resolved, err := only(schema.Replay).Resolved()
	require.NoError(t, err)
	require.Equal(t, []schema.Component{schema.Consumer, schema.Replay}, resolved)
	require.NoError(t, schema.Migrate(ctx, db, only(schema.Replay)))
	replayTables, err := only(schema.Replay).Tables()
	require.NoError(t, err)
	require.ElementsMatch(t, append(replayTables, prefix+schema.VersionTable), tablesWith(t, ctx, db, prefix))
	require.Len(t, versionRows(t, ctx, db, prefix), 4)
}

// tablesWith lists the tables of the current schema whose name starts with
// prefix.
func tablesWith(t *testing.T, ctx context.Context, db *sqlx.DB, prefix string) []string {
	t.Helper()
	var names []string
	require.NoError(t, db.SelectContext(ctx, &names, "SELECT table_name FROM information_schema.tables WHERE table_schema = "+currentSchema(db)))
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// versionRows are the version table's rows under prefix, as
// "part version name applied_at", by part (descending: txlog first) and
// version.
func versionRows(t *testing.T, ctx context.Context, db *sqlx.DB, prefix string) []string {
	t.Helper()
	var rows []struct {
		Part    string    `db:"part"`
		Version int       `db:"version"`
		Name    string    `db:"name"`
		At      time.Time `db:"applied_at"`
	}
	require.NoError(t, db.SelectContext(ctx, &rows, "SELECT part, version, name, applied_at FROM "+prefix+schema.VersionTable+" ORDER BY part DESC, version"))
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = fmt.Sprintf("%s %d %s %s", r.Part, r.Version, r.Name, r.At.UTC().Format(time.RFC3339Nano))
	}
	return out
}

// describe is what information_schema says of the tables under prefix,
// version table included, the prefix written as "<p>": tables, columns
// with type, nullability, default and identity, indexes with their columns,
// and the version table's (part, version, name) rows.
func describe(t *testing.T, ctx context.Context, db *sqlx.DB, prefix string) []string {
	t.Helper()
	var cols, idx []string
	var colQuery, idxQuery string
	if dialect.Must(db).Name() == "postgres" {
		colQuery = "SELECT CONCAT_WS(' ', table_name, column_name, data_type, COALESCE(character_maximum_length::text, '-')," +
			" COALESCE(numeric_precision::text, '-'), COALESCE(datetime_precision::text, '-'), is_nullable, COALESCE(column_default, '-'), is_identity)" +
			" FROM information_schema.columns WHERE table_schema = current_schema()"
		idxQuery = "SELECT CONCAT_WS(' ', tablename, indexname, indexdef) FROM pg_indexes WHERE schemaname = current_schema()"
	} else {
		colQuery = "SELECT CONCAT_WS(' ', table_name, column_name, column_type, is_nullable, COALESCE(column_default, '-'), extra," +
			" COALESCE(character_set_name, '-'), COALESCE(collation_name, '-')) FROM information_schema.columns WHERE table_schema = DATABASE()"
		idxQuery = "SELECT CONCAT_WS(' ', table_name, index_name, non_unique, seq_in_index, column_name) FROM information_schema.statistics" +
			" WHERE table_schema = DATABASE()"
	}
	require.NoError(t, db.SelectContext(ctx, &cols, colQuery))
	require.NoError(t, db.SelectContext(ctx, &idx, idxQuery))
	var out []string
	for _, s := range append(cols, idx...) {
		if strings.HasPrefix(s, prefix) {
			out = append(out, strings.ReplaceAll(s, prefix, "<p>"))
		}
	}
	for _, r := range versionRows(t, ctx, db, prefix) {
		f := strings.Fields(r)
		out = append(out, "row "+strings.Join(f[:len(f)-1], " ")) // applied_at differs
	}
	sort.Strings(out)
	return out
}
