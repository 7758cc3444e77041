package txlog

import (
	"context"
	"embed"
	"fmt"

	"github.com/rmqtx/rmqtx/internal/migrate"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one embedded schema step.
type Migration = migrate.Migration

// Migrations returns the embedded migrations in version order, with
// {{table}} still in place.
func Migrations() ([]Migration, error) {
	ms, err := migrate.Load(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("txlog: %w", err)
	}
	return ms, nil
}

// Migrate creates or upgrades the schema. It is idempotent and safe to run
// from several processes at once: runs are serialized with a named lock and
// applied versions are recorded in <table>_schema.
func (s *Store) Migrate(ctx context.Context) error {
	err := migrate.Run(ctx, s.db, migrate.Plan{
		FS: migrationFS, Dir: "migrations",
		Replace:     map[string]string{"{{table}}": s.table},
		SchemaTable: s.schemaTable,
	})
	if err != nil {
		return fmt.Errorf("txlog: %w", err)
	}
	return nil
}
