package txlog

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Migration is one embedded schema step.
type Migration struct {
	Version int
	Name    string
	SQL     string // with {{table}} still in place
}

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, fmt.Errorf("txlog: migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("txlog: migration %s: name must start with NNN_", e.Name())
		}
		b, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, fmt.Errorf("txlog: migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	return ms, nil
}

func statements(sqlText string) []string {
	var out []string
	var cur []string
	for _, line := range strings.Split(sqlText, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "--") || t == "" {
			continue
		}
		cur = append(cur, line)
		if strings.HasSuffix(t, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(strings.Join(cur, "\n")), ";"))
			cur = nil
		}
	}
	if len(cur) > 0 {
		out = append(out, strings.Join(cur, "\n"))
	}
	return out
}

// Migrate creates or upgrades the schema. It is idempotent and safe to run
// from several processes at once: every step is CREATE ... IF NOT EXISTS
// and applied versions are recorded in <table>_schema.
func (s *Store) Migrate(ctx context.Context) error {
	ms, err := Migrations()
	if err != nil {
		return err
	}
	if _, err := s.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+s.schemaTable+
		" (version INT NOT NULL PRIMARY KEY, name VARCHAR(255) NOT NULL, applied_at DATETIME(6) NOT NULL)"+
		" ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"); err != nil {
		return fmt.Errorf("txlog: migrate: schema table: %w", err)
	}
	var applied []int
	if err := s.db.SelectContext(ctx, &applied, "SELECT version FROM "+s.schemaTable); err != nil {
		return fmt.Errorf("txlog: migrate: %w", err)
	}
	done := map[int]bool{}
	for _, v := range applied {
		done[v] = true
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		for _, stmt := range statements(strings.ReplaceAll(m.SQL, "{{table}}", s.table)) {
			if _, err := s.db.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("txlog: migrate %s: %w", m.Name, err)
			}
		}
		if _, err := s.db.ExecContext(ctx, "INSERT IGNORE INTO "+s.schemaTable+" (version, name, applied_at) VALUES (?, ?, ?)",
			m.Version, m.Name, s.now()); err != nil {
			return fmt.Errorf("txlog: migrate %s: record version: %w", m.Name, err)
		}
	}
	return nil
}
