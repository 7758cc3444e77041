// Package schema is the one place that migrates rmqtx's tables: the
// transaction log (component TxLog), the outbox (Outbox), the consumer's
// tables (Consumer: consume log, aggregate versions, attempts, dead
// letters) and the replay audit (Replay).
//
// Each table has one owner, the package named above: it holds the table's
// migrations (one folder per database dialect), every query on the table
// and its state names; other packages call the owner's functions. This
// package only runs the owners' migrations as one plan, in dependency order
// (the replay audit refers to the dead letters), so it imports them and
// none of them imports it.
//
// There are two ways to apply the plan:
//
//   - Migrate (or MigrateAll for every component) runs it against a
//     database, at deploy time or at start-up; `rmqtx migrate` does the
//     same. Every step is idempotent and serialized with a named lock, so
//     several processes may run it at once.
//   - Files writes it as numbered SQL files for a team's own migration
//     tool (golang-migrate, goose, Atlas); `rmqtx migrate --print` writes
//     them to a directory.
//
// Both record each applied step, per component, in one version table,
// <prefix>schema_migrations, so a service may start with the components it
// uses and add others later (only their steps run), and may switch from
// one way to the other without a step running twice.
//
// The table prefix: "" means DefaultPrefix ("rmqtx_"), here and in every
// rmqtx package. Tables without a prefix are not supported: a bare
// schema_migrations or outbox table would collide with a service's own.
package schema

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/txlog"
)

// DefaultPrefix is the table prefix of every rmqtx table unless configured;
// an empty prefix means it.
const DefaultPrefix = sqlname.DefaultPrefix

// ErrConfig is wrapped by errors about the arguments (nil DB, bad prefix,
// unknown component, dialect or format).
var ErrConfig = errors.New("schema: invalid argument")

// VersionTable is the suffix of the one table that records which
// migrations ran: <prefix>schema_migrations, one row per (part, version).
const VersionTable = "schema_migrations"

// Component is a group of tables a service may or may not use.
type Component string

// The components, in the order the plan migrates them.
const (
	// TxLog is the transaction log of txproducer and checkback (<prefix>txlog).
	TxLog Component = "txlog"
	// Outbox is the outbox table (<prefix>outbox).
	Outbox Component = "outbox"
	// Consumer is the consumer's consume log, aggregate versions, attempts
	// and dead letters.
	Consumer Component = "consumer"
	// Replay is the replay audit. It records replays of the consumer's dead
	// letters, so asking for it brings Consumer too.
	Replay Component = "replay"
)

// Options says which tables Migrate creates.
type Options struct {
	// Prefix of the table names; "" means DefaultPrefix.
	Prefix string
	// Components to migrate; empty means all of them. Components a chosen
	// one needs are added (Replay brings Consumer). The order given does
	// not matter: the plan's order does.
	Components []Component
}

// part is one owner's share of the schema.
type part struct {
	component Component
	// name keys the part's versions in the version table ("txlog",
	// "replay audit"); it never changes, or databases would run steps
	// again.
	name       string
	migrations func(dialect, prefix string) (fs.FS, map[string]string, error)
	tables     func(prefix string) ([]string, error)
	// legacy is the suffix of the version table this owner kept before
	// the single plan; its versions are adopted on the first run.
	legacy string
	// needs are the components this one's tables refer to.
	needs []Component
}

// parts are the owners of rmqtx's tables, in the order the plan migrates
// them (the replay audit refers to the dead letters).
var parts = []part{
	{component: TxLog, name: "txlog", migrations: txlog.Migrations, legacy: "txlog_schema",
		tables: func(prefix string) ([]string, error) {
			n, err := txlog.TableName(prefix)
			return []string{n}, err
		}},
	{component: Outbox, name: "outbox", migrations: outbox.Migrations, legacy: "outbox_schema",
		tables: func(prefix string) ([]string, error) {
			t, err := outbox.NewTable(prefix)
			return []string{t.Name()}, err
		}},
	{component: Consumer, name: "consumer", migrations: consumer.Migrations, legacy: "consumer_schema",
		tables: func(prefix string) ([]string, error) {
			t, err := consumer.Tables(prefix)
			return []string{t.ConsumeLog, t.AggregateVersion, t.Attempt, t.DeadLetter, t.Window}, err
		}},
	{component: Replay, name: "replay audit", migrations: replay.Migrations, legacy: "replay_schema", needs: []Component{Consumer},
		tables: func(prefix string) ([]string, error) {
			t, err := replay.Tables(prefix)
			return []string{t.Audit, t.AuditItem}, err
		}},
}

// Components returns every component, in the order the plan migrates them.
func Components() []Component {
	out := make([]Component, len(parts))
	for i, p := range parts {
		out[i] = p.component
	}
	return out
}

// ParseComponents reads a comma-separated list of component names
// ("txlog,outbox"), as flags and settings spell it; "" or "all" means all.
func ParseComponents(s string) ([]Component, error) {
	if strings.TrimSpace(s) == "" || strings.TrimSpace(s) == "all" {
		return Components(), nil
	}
	var out []Component
	for _, f := range strings.Split(s, ",") {
		c := Component(strings.TrimSpace(f))
		if _, err := partOf(c); err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func partOf(c Component) (part, error) {
	for _, p := range parts {
		if p.component == c {
			return p, nil
		}
	}
	return part{}, fmt.Errorf("%w: unknown component %q (want %s)", ErrConfig, c, joinComponents(Components()))
}

func joinComponents(cs []Component) string {
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}

// resolve validates o and returns its prefix and its parts, the needed ones
// added, in plan order.
func (o Options) resolve() (string, []part, error) {
	prefix, err := validPrefix(o.Prefix)
	if err != nil {
		return "", nil, err
	}
	if len(o.Components) == 0 {
		return prefix, parts, nil
	}
	want := map[Component]bool{}
	var add func(c Component) error
	add = func(c Component) error {
		p, err := partOf(c)
		if err != nil {
			return err
		}
		want[c] = true
		for _, n := range p.needs {
			if err := add(n); err != nil {
				return err
			}
		}
		return nil
	}
	for _, c := range o.Components {
		if err := add(c); err != nil {
			return "", nil, err
		}
	}
	var out []part
	for _, p := range parts {
		if want[p.component] {
			out = append(out, p)
		}
	}
	return prefix, out, nil
}

// Resolved returns the components o migrates, the needed ones added, in
// plan order, or an error wrapping ErrConfig.
func (o Options) Resolved() ([]Component, error) {
	_, ps, err := o.resolve()
	if err != nil {
		return nil, err
	}
	out := make([]Component, len(ps))
	for i, p := range ps {
		out[i] = p.component
	}
	return out, nil
}

// plan builds the runner's parts for dialect d.
func plan(d, prefix string, ps []part) ([]migrate.Part, error) {
	out := make([]migrate.Part, 0, len(ps))
	for _, p := range ps {
		fsys, names, err := p.migrations(d, prefix)
		if err != nil {
			return nil, fmt.Errorf("schema: %s: %w", p.component, err)
		}
		out = append(out, migrate.Part{Name: p.name, FS: fsys, Replace: names, Legacy: prefix + p.legacy})
	}
	return out, nil
}

// Migrate creates or upgrades the tables of the components o names under
// its prefix: one plan, the owners' steps in plan order, recorded per
// component in one version table (<prefix>schema_migrations). Only the
// steps that table does not record run, so a service that migrated
// {TxLog} and later asks for {TxLog, Consumer} runs the consumer's steps
// only, and a database migrated with the files of Files is adopted as it
// is. Migrate is idempotent and serialized with the database's named lock,
// so several processes may run it at once.
//
// A database created by a release that kept one version table per owner
// (<prefix>txlog_schema and the like) is adopted too: the versions those
// tables record are not run again, and the old tables are left in place.
// On error the components before the failing one are migrated and the
// error names the component.
func Migrate(ctx context.Context, db *sqlx.DB, o Options) error {
	if db == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	d, err := dialect.For(db)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	prefix, ps, err := o.resolve()
	if err != nil {
		return err
	}
	pl, err := plan(d.Name(), prefix, ps)
	if err != nil {
		return err
	}
	if err := migrate.Run(ctx, db, prefix+VersionTable, pl...); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	return nil
}

// MigrateAll is Migrate of every component under prefix ("" means
// DefaultPrefix).
func MigrateAll(ctx context.Context, db *sqlx.DB, prefix string) error {
	return Migrate(ctx, db, Options{Prefix: prefix})
}

// Tables returns the name of every table MigrateAll creates under prefix
// ("" means DefaultPrefix), in plan order. The version tables are not
// listed.
func Tables(prefix string) ([]string, error) {
	return Options{Prefix: prefix}.Tables()
}

// Tables returns the name of every table Migrate creates with o, in plan
// order. The version tables are not listed.
func (o Options) Tables() ([]string, error) {
	prefix, ps, err := o.resolve()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range ps {
		ts, err := p.tables(prefix)
		if err != nil {
			return nil, fmt.Errorf("schema: %s: %w", p.component, err)
		}
		out = append(out, ts...)
	}
	return out, nil
}

// PartNames names the parts as the version table's part column records
// them, in plan order: "txlog", "outbox", "consumer", "replay audit" (the
// Replay component's part).
func PartNames() []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.name
	}
	return out
}

func validPrefix(prefix string) (string, error) {
	prefix, err := sqlname.Prefix(prefix)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return prefix, nil
}
