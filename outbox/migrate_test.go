package outbox

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// migrateOutbox creates or upgrades the outbox table under prefix as
// schema.MigrateAll does (schema imports this package, so its tests cannot
// import schema): the package's steps as the "outbox" part of the plan
// recorded in <prefix>schema_migrations, adopting the version table a
// database migrated before the plan kept.
func migrateOutbox(ctx context.Context, db *sqlx.DB, prefix string) error {
	d, err := dialect.For(db)
	if err != nil {
		return err
	}
	fsys, names, err := Migrations(d.Name(), prefix)
	if err != nil {
		return err
	}
	prefix = sqlname.OrDefault(prefix)
	return migrate.Run(ctx, db, prefix+"schema_migrations", migrate.Part{
		Name: "outbox", FS: fsys, Replace: names, Legacy: prefix + TableSuffix + "_schema",
	})
}

func TestMigrationsRefuseUnknownDialectAndBadPrefix(t *testing.T) {
	t.Parallel()
	for _, d := range []string{"", "sqlite3", "oracle", "../mysql", "mysql/..", "postgres/..", "."} {
		_, _, err := Migrations(d, "")
		require.ErrorIs(t, err, ErrConfig, "dialect %q", d)
		require.ErrorContains(t, err, "outbox: ")
	}
	_, _, err := Migrations("mysql", "x; DROP TABLE y")
	require.ErrorIs(t, err, ErrConfig)

	for _, d := range []string{"mysql", "postgres"} {
		_, names, err := Migrations(d, "")
		require.NoError(t, err)
		require.Equal(t, map[string]string{"{{table}}": "rmqtx_outbox"}, names)
		_, names, err = Migrations(d, "svc_")
		require.NoError(t, err)
		require.Equal(t, map[string]string{"{{table}}": "svc_outbox"}, names)
	}
}

func TestMigrationStatements(t *testing.T) {
	t.Parallel()
	fsys, names, err := Migrations("mysql", "p_")
	require.NoError(t, err)
	ms, err := migrate.Load(fsys, ".")
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	require.Equal(t, 1, ms[0].Version)
	pairs := []string{}
	for k, v := range names {
		pairs = append(pairs, k, v)
	}
	stmts := migrate.Statements(ms[0].SQL, strings.NewReplacer(pairs...))
	require.Len(t, stmts, 1)
	require.Contains(t, stmts[0], "CREATE TABLE IF NOT EXISTS p_outbox (")
	require.NotContains(t, stmts[0], "{{")
	require.NotContains(t, stmts[0], "--")
	for _, col := range []string{"event_id", "aggregate_type", "aggregate_id", "aggregate_version", "event_type",
		"event_version", "destination", "message_key", "payload", "headers", "status", "owner_token", "lease_until",
		"retry_count", "next_retry_at", "last_error_code", "last_error_message", "created_at", "sent_at", "updated_at",
		"idx_outbox_dispatch (status, next_retry_at, created_at)"} {
		require.Contains(t, stmts[0], col)
	}
}
