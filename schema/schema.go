// Package schema is the one place that migrates every rmqtx table: the
// transaction log (txlog), the outbox (outbox), the consumer's tables
// (consumer: consume log, aggregate versions, attempts, dead letters) and
// the replay audit (replay).
//
// Each table has one owner, the package named above: it holds the table's
// migrations (one folder per database dialect), every query on the table
// and its state names; other packages call the owner's functions. This
// package only runs the owners' migrations as one plan, in dependency order
// (the replay audit refers to the dead letters), so it imports them and
// none of them imports it. Call MigrateAll at deploy time or at start-up;
// `rmqtx migrate` does the same. Every step is idempotent and serialized
// with a named lock, so several processes may run it at once.
package schema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/txlog"
)

// DefaultPrefix is the table prefix of every rmqtx table unless configured.
const DefaultPrefix = sqlname.DefaultPrefix

// ErrConfig is wrapped by errors about the arguments (nil DB, bad prefix).
var ErrConfig = errors.New("schema: invalid argument")

// VersionTable is the suffix of the one table that records which
// migrations ran: <prefix>schema_migrations, one row per (part, version).
const VersionTable = "schema_migrations"

// part is one owner's share of the schema.
type part struct {
	name       string // "txlog", "outbox", "consumer", "replay audit"
	migrations func(dialect, prefix string) (fs.FS, map[string]string, error)
	tables     func(prefix string) ([]string, error)
	// legacy is the suffix of the version table this owner kept before
	// the single plan; its versions are adopted on the first run.
	legacy string
}

// parts are the owners of rmqtx's tables, in the order MigrateAll migrates
// them (the replay audit refers to the dead letters).
var parts = []part{
	{name: "txlog", migrations: txlog.Migrations, legacy: "txlog_schema",
		tables: func(prefix string) ([]string, error) {
			n, err := txlog.TableName(prefix)
			return []string{n}, err
		}},
	{name: "outbox", migrations: outbox.Migrations, legacy: "outbox_schema",
		tables: func(prefix string) ([]string, error) {
			t, err := outbox.NewTable(prefix)
			return []string{t.Name()}, err
		}},
	{name: "consumer", migrations: consumer.Migrations, legacy: "consumer_schema",
		tables: func(prefix string) ([]string, error) {
			t, err := consumer.Tables(prefix)
			return []string{t.ConsumeLog, t.AggregateVersion, t.Attempt, t.DeadLetter}, err
		}},
	{name: "replay audit", migrations: replay.Migrations, legacy: "replay_schema",
		tables: func(prefix string) ([]string, error) {
			t, err := replay.Tables(prefix)
			return []string{t.Audit, t.AuditItem}, err
		}},
}

// MigrateAll creates or upgrades every rmqtx table under prefix ("" means
// DefaultPrefix): one plan, the owners' steps in the order of PartNames,
// recorded in one version table (<prefix>schema_migrations). It is the only
// way rmqtx migrates. It is idempotent and serialized with the database's
// named lock, so several processes may run it at once. A database created
// by a release that kept one version table per owner (<prefix>txlog_schema
// and the like) is adopted: the versions those tables record are not run
// again, and the old tables are left in place. On error the parts before
// the failing one are migrated and the error names the part.
func MigrateAll(ctx context.Context, db *sqlx.DB, prefix string) error {
	if db == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	d, err := dialect.For(db)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	prefix, err = validPrefix(prefix)
	if err != nil {
		return err
	}
	plan := make([]migrate.Part, 0, len(parts))
	for _, p := range parts {
		fsys, names, err := p.migrations(d.Name(), prefix)
		if err != nil {
			return fmt.Errorf("schema: %s: %w", p.name, err)
		}
		plan = append(plan, migrate.Part{Name: p.name, FS: fsys, Replace: names, Legacy: prefix + p.legacy})
	}
	if err := migrate.Run(ctx, db, prefix+VersionTable, plan...); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	return nil
}

// Tables returns the name of every table MigrateAll creates under prefix
// ("" means DefaultPrefix), in PartNames order. The owners' version tables
// (<table>_schema and the like) are not listed.
func Tables(prefix string) ([]string, error) {
	prefix, err := validPrefix(prefix)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range parts {
		ts, err := p.tables(prefix)
		if err != nil {
			return nil, fmt.Errorf("schema: %s: %w", p.name, err)
		}
		out = append(out, ts...)
	}
	return out, nil
}

// PartNames names the owners MigrateAll migrates, in order: "txlog",
// "outbox", "consumer", "replay audit".
func PartNames() []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.name
	}
	return out
}

func validPrefix(prefix string) (string, error) {
	prefix = sqlname.OrDefault(prefix)
	if err := sqlname.ValidatePrefix(prefix); err != nil {
		return "", fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return prefix, nil
}
