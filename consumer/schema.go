package consumer

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"

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

type migration struct {
	version    int
	statements []string
}

func loadMigrations(prefix string) ([]migration, error) {
	names, err := fs.Glob(migrationFS, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []migration
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		v, err := strconv.Atoi(strings.SplitN(base, "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("consumer: migration %s: bad version: %w", name, err)
		}
		raw, err := migrationFS.ReadFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, statements: splitSQL(strings.ReplaceAll(string(raw), "{{prefix}}", prefix))})
	}
	return out, nil
}

// splitSQL splits a migration file into statements on ';' at line ends and
// drops '--' comment lines. Migrations hold no string literals with ';'.
func splitSQL(s string) []string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	var out []string
	for _, stmt := range strings.Split(b.String(), ";\n") {
		if stmt = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(stmt), ";")); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
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
	migs, err := loadMigrations(prefix)
	if err != nil {
		return err
	}
	applied := map[int]bool{}
	var versions []int
	// The schema table may not exist yet: that is version 0.
	if err := db.SelectContext(ctx, &versions, "SELECT version FROM "+t.schema); err == nil {
		for _, v := range versions {
			applied[v] = true
		}
	}
	for _, m := range migs {
		if applied[m.version] {
			continue
		}
		for _, stmt := range m.statements {
			if _, err := db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("consumer: migrate %d: %w", m.version, err)
			}
		}
		if _, err := db.ExecContext(ctx, "INSERT IGNORE INTO "+t.schema+" (version, applied_at) VALUES (?, UTC_TIMESTAMP(6))", m.version); err != nil {
			return fmt.Errorf("consumer: migrate %d: record version: %w", m.version, err)
		}
	}
	return nil
}
