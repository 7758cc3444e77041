package schema_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
)

// createdTables reads every embedded migration of the repository for
// dialect d (any <pkg>/migrations/<d>/*.sql) and returns the tables they
// create under prefix, so a package that adds migrations MigrateAll does not
// run fails the test.
func createdTables(t *testing.T, d, prefix string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "*", "migrations", d, "*.sql"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	create := regexp.MustCompile(`(?i)CREATE TABLE (?:IF NOT EXISTS )?(\{\{([a-z_]+)\}\})([A-Za-z0-9_]*)`)
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		pkg := filepath.Base(filepath.Dir(filepath.Dir(filepath.Dir(f))))
		for _, m := range create.FindAllStringSubmatch(string(b), -1) {
			switch m[2] {
			case "table": // {{table}} is <prefix><package>
				out = append(out, prefix+pkg+m[3])
			case "prefix":
				out = append(out, prefix+m[3])
			default: // {{name}} is <prefix><name>
				out = append(out, prefix+m[2]+m[3])
			}
		}
	}
	sort.Strings(out)
	return out
}

func TestTablesListsEveryMigratedTable(t *testing.T) {
	got, err := schema.Tables("acme_")
	require.NoError(t, err)
	sort.Strings(got)
	require.Equal(t, createdTables(t, "mysql", "acme_"), got)
	require.Equal(t, createdTables(t, "postgres", "acme_"), got)

	def, err := schema.Tables("")
	require.NoError(t, err)
	require.Contains(t, def, "rmqtx_txlog")
	require.Contains(t, def, "rmqtx_dead_letter")

	_, err = schema.Tables("bad-prefix")
	require.ErrorIs(t, err, schema.ErrConfig)
	require.Error(t, schema.MigrateAll(context.Background(), nil, ""))
}

// TestEveryDialectHasTheSameMigrations: each owner's migrations folder
// holds the same files (versions and names) for every database.
func TestEveryDialectHasTheSameMigrations(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "*", "migrations"))
	require.NoError(t, err)
	require.Len(t, dirs, len(schema.PartNames()))
	for _, dir := range dirs {
		names := func(d string) []string {
			files, err := filepath.Glob(filepath.Join(dir, d, "*.sql"))
			require.NoError(t, err)
			for i, f := range files {
				files[i] = filepath.Base(f)
			}
			return files
		}
		require.NotEmpty(t, names("mysql"), dir)
		require.Equal(t, names("mysql"), names("postgres"), dir)
	}
}

// TestMigrateAllCreatesEveryTable: one call creates every rmqtx table, is
// idempotent, and may run from several processes at once.
func TestMigrateAllCreatesEveryTable(t *testing.T) {
	testenv.EachDB(t, testMigrateAllCreatesEveryTable)
}

func testMigrateAllCreatesEveryTable(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := "m" + testenv.RandSuffix(6) + "_"
	tablesNow := func() []string {
		var names []string
		require.NoError(t, db.SelectContext(ctx, &names, db.Rebind("SELECT table_name FROM information_schema.tables WHERE table_schema = "+
			currentSchema(db)+" AND table_name LIKE ? AND table_name <> ? ORDER BY table_name"), prefix+"%", prefix+schema.VersionTable))
		return names
	}
	require.Empty(t, tablesNow())

	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = schema.MigrateAll(ctx, db, prefix)
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	want := createdTables(t, dialect.Must(db).Name(), prefix)
	require.Equal(t, want, tablesNow())

	// Idempotent: a second run finds nothing left to do.
	require.NoError(t, schema.MigrateAll(ctx, db, prefix))
	require.Equal(t, want, tablesNow())
	var parts []string
	require.NoError(t, db.SelectContext(ctx, &parts, "SELECT DISTINCT part FROM "+prefix+schema.VersionTable+" ORDER BY part"))
	require.ElementsMatch(t, schema.PartNames(), parts, "one version table records every owner's steps")

	// The tables are usable by their owners: a dead-letter count works.
	store, err := consumer.NewDeadLetterStore(db, prefix)
	require.NoError(t, err)
	n, err := store.Count(ctx, "", "")
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, strings.HasPrefix(want[0], prefix))
}

// currentSchema is the SQL for the schema unqualified table names live in.
func currentSchema(db *sqlx.DB) string {
	if dialect.Must(db).Name() == "postgres" {
		return "current_schema()"
	}
	return "DATABASE()"
}

// TestDialectsCreateTheSameTables migrates a MariaDB and a PostgreSQL
// database and compares what the owners' migrations made of them: the same
// tables with the same columns, the same nullability, the same primary and
// unique keys.
func TestDialectsCreateTheSameTables(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	describe := func(db *sqlx.DB) []string {
		require.NoError(t, schema.MigrateAll(ctx, db, ""))
		var cols []string
		require.NoError(t, db.SelectContext(ctx, &cols, "SELECT CONCAT(table_name, '.', column_name, ' nullable=', is_nullable)"+
			" FROM information_schema.columns WHERE table_schema = "+currentSchema(db)))
		var keys []struct {
			Table string `db:"t"`
			Type  string `db:"k"`
			Name  string `db:"n"`
			Col   string `db:"c"`
		}
		require.NoError(t, db.SelectContext(ctx, &keys, "SELECT tc.table_name AS t, tc.constraint_type AS k, tc.constraint_name AS n, ku.column_name AS c"+
			" FROM information_schema.table_constraints tc JOIN information_schema.key_column_usage ku"+
			" ON ku.constraint_schema = tc.constraint_schema AND ku.constraint_name = tc.constraint_name AND ku.table_name = tc.table_name"+
			" WHERE tc.table_schema = "+currentSchema(db)+" AND tc.constraint_type IN ('PRIMARY KEY', 'UNIQUE')"+
			" ORDER BY tc.table_name, tc.constraint_type, tc.constraint_name, ku.ordinal_position"))
		byKey := map[string][]string{}
		var order []string
		for _, k := range keys {
			id := k.Table + " " + k.Type + " " + k.Name
			if byKey[id] == nil {
				order = append(order, id)
			}
			byKey[id] = append(byKey[id], k.Col)
		}
		for _, id := range order {
			f := strings.Fields(id) // table, type words, name
			cols = append(cols, f[0]+" "+strings.Join(f[1:len(f)-1], " ")+" ("+strings.Join(byKey[id], ", ")+")")
		}
		sort.Strings(cols)
		return cols
	}
	my := describe(testenv.MySQLDB(t))
	pg := describe(testenv.PostgresDB(t))
	require.NotEmpty(t, my)
	require.Equal(t, my, pg)
}
