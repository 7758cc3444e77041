package consumer

import (
	"context"
	"embed"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// DefaultTablePrefix is used when a Config or store is given no prefix.
const DefaultTablePrefix = "rmqtx_"

//go:embed migrations/*.sql
var migrationFS embed.FS

// tables holds the prefixed table names, built once from a validated prefix.
type tables struct {
	log, version, attempt, dead, schema string
}

func newTables(prefix string) (tables, error) {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if err := sqlname.ValidatePrefix(prefix); err != nil {
		return tables{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return tables{
		log:     prefix + "consume_log",
		version: prefix + "aggregate_version",
		attempt: prefix + "consume_attempt",
		dead:    prefix + "dead_letter",
		schema:  prefix + "consumer_schema",
	}, nil
}

// Migrate creates or upgrades the consumer tables (consume log, aggregate
// versions, attempts, dead letters) under prefix ("" means
// DefaultTablePrefix). It is idempotent and safe to run from several
// processes at once; it works on MariaDB 10.11 and MySQL 8.
func Migrate(ctx context.Context, db *sqlx.DB, prefix string) error {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	t, err := newTables(prefix)
	if err != nil {
		return err
	}
	err = migrate.Run(ctx, db, migrate.Plan{
		FS: migrationFS, Dir: "migrations",
		Replace:     map[string]string{"{{prefix}}": prefix},
		SchemaTable: t.schema,
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	return nil
}
