// Package schema is the one place that migrates every rmqtx table: the
// transaction log (txlog), the outbox (outbox), the consumer's tables
// (consumer: consume log, aggregate versions, attempts, dead letters) and
// the replay audit (replay).
//
// Each table has one owner, the package named above: it holds the table's
// migrations, exports its name, the columns and states other packages read,
// and the queries they run. This package only runs the owners' migrations,
// in dependency order (the replay audit refers to the dead letters), so it
// imports them and none of them imports it. Call MigrateAll at deploy time or
// at start-up; `rmqtx migrate` does the same. Every step is idempotent and
// serialized with a named lock, so several processes may run it at once.
package schema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/txlog"
)

// DefaultPrefix is the table prefix of every rmqtx table unless configured.
const DefaultPrefix = sqlname.DefaultPrefix

// ErrConfig is wrapped by errors about the arguments (nil DB, bad prefix).
var ErrConfig = errors.New("schema: invalid argument")

// part is one owner's share of the schema.
type part struct {
	name    string // "txlog", "outbox", "consumer", "replay audit"
	migrate func(ctx context.Context, db *sqlx.DB, prefix string) error
	tables  func(prefix string) ([]string, error)
}

// parts are the owners of rmqtx's tables, in the order MigrateAll migrates
// them.
var parts = []part{
	{name: "txlog",
		migrate: func(ctx context.Context, db *sqlx.DB, prefix string) error {
			s, err := txlog.New(db, prefix)
			if err != nil {
				return err
			}
			return s.Migrate(ctx)
		},
		tables: func(prefix string) ([]string, error) {
			n, err := txlog.TableName(prefix)
			return []string{n}, err
		}},
	{name: "outbox",
		migrate: outbox.Migrate,
		tables: func(prefix string) ([]string, error) {
			t, err := outbox.NewTable(prefix)
			return []string{t.Name()}, err
		}},
	{name: "consumer",
		migrate: consumer.Migrate,
		tables: func(prefix string) ([]string, error) {
			t, err := consumer.Tables(prefix)
			return []string{t.ConsumeLog, t.AggregateVersion, t.Attempt, t.DeadLetter}, err
		}},
	{name: "replay audit",
		migrate: replay.Migrate,
		tables: func(prefix string) ([]string, error) {
			t, err := replay.Tables(prefix)
			return []string{t.Audit, t.AuditItem}, err
		}},
}

// MigrateAll creates or upgrades every rmqtx table under prefix ("" means
// DefaultPrefix), owner by owner in the order of PartNames. It is idempotent;
// on error the parts before the failing one are migrated and the error names
// the part.
func MigrateAll(ctx context.Context, db *sqlx.DB, prefix string) error {
	if db == nil {
		return fmt.Errorf("%w: nil DB", ErrConfig)
	}
	prefix, err := validPrefix(prefix)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if err := p.migrate(ctx, db, prefix); err != nil {
			return fmt.Errorf("schema: migrate %s: %w", p.name, err)
		}
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
