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

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
)

// createdTables reads every embedded MySQL migration of the repository (any
// <pkg>/migrations/mysql/*.sql) and returns the tables they create under prefix,
// so a package that adds migrations MigrateAll does not run fails the test.
func createdTables(t *testing.T, prefix string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "*", "migrations", "mysql", "*.sql"))
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
	require.Equal(t, createdTables(t, "acme_"), got)

	def, err := schema.Tables("")
	require.NoError(t, err)
	require.Contains(t, def, "rmqtx_txlog")
	require.Contains(t, def, "rmqtx_dead_letter")

	_, err = schema.Tables("bad-prefix")
	require.ErrorIs(t, err, schema.ErrConfig)
	require.Error(t, schema.MigrateAll(context.Background(), nil, ""))
}

// TestMigrateAllCreatesEveryTable: one call creates every rmqtx table, is
// idempotent, and may run from several processes at once.
func TestMigrateAllCreatesEveryTable(t *testing.T) {
	db := testenv.DB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	prefix := "m" + testenv.RandSuffix(6) + "_"
	tablesNow := func() []string {
		var names []string
		require.NoError(t, db.SelectContext(ctx, &names, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"+
			" AND table_name LIKE ? AND table_name <> ? ORDER BY table_name", prefix+"%", prefix+schema.VersionTable))
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
	want := createdTables(t, prefix)
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
