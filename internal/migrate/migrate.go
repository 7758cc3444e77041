// Package migrate applies the embedded SQL migrations of rmqtx's packages
// (txlog, outbox, consumer, replay) with one runner: files named
// NNN_description.sql, placeholders such as {{table}} or {{prefix}} replaced
// by validated names, applied versions recorded in a schema table, and
// concurrent runs serialized with a named lock (GET_LOCK), so several
// processes may migrate at start-up. Works on MariaDB 10.6+ and MySQL 8.
package migrate

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// Migration is one embedded schema step.
type Migration struct {
	Version int
	Name    string // file name
	SQL     string // placeholders still in place
}

// Load reads dir of fsys: every NNN_*.sql file, in version order.
func Load(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	var ms []Migration
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %q: name must start with NNN_", e.Name())
		}
		b, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		ms = append(ms, Migration{Version: v, Name: e.Name(), SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i := 1; i < len(ms); i++ {
		if ms[i].Version == ms[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", ms[i-1].Name, ms[i].Name, ms[i].Version)
		}
	}
	return ms, nil
}

// Statements splits a migration into statements: blank and "--" comment
// lines are dropped, and a statement ends with a line ending in ';'.
// Migrations hold no string literal that ends a line with ';'.
func Statements(src string, r *strings.Replacer) []string {
	var out []string
	var cur strings.Builder
	flush := func() {
		if s := strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"); s != "" {
			if r != nil {
				s = r.Replace(s)
			}
			out = append(out, s)
		}
		cur.Reset()
	}
	for _, line := range strings.Split(src, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(t, ";") {
			flush()
		}
	}
	flush()
	return out
}

// Plan says what Run applies.
type Plan struct {
	FS          fs.FS
	Dir         string            // folder of NNN_*.sql files in FS
	Replace     map[string]string // placeholder -> validated identifier
	SchemaTable string            // validated name of the version table
}

// Run applies the migrations of p that SchemaTable does not record yet. It
// is idempotent. Errors are returned unwrapped-prefix; callers add theirs.
func Run(ctx context.Context, db *sqlx.DB, p Plan) error {
	ms, err := Load(p.FS, p.Dir)
	if err != nil {
		return err
	}
	pairs := make([]string, 0, 2*len(p.Replace))
	for k, v := range p.Replace {
		pairs = append(pairs, k, v)
	}
	r := strings.NewReplacer(pairs...)

	conn, err := db.Connx(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	lock := "rmqtx_migrate_" + p.SchemaTable
	var got sql.NullInt64
	if err := conn.GetContext(ctx, &got, "SELECT GET_LOCK(?, 60)", lock); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("migrate: could not take lock %s within 60s", lock)
	}
	defer func() {
		// Release on a fresh context: the caller's may be done.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(rctx, "SELECT RELEASE_LOCK(?)", lock)
	}()
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+p.SchemaTable+` (
  version    INT          NOT NULL,
  name       VARCHAR(255) NOT NULL,
  applied_at DATETIME(6)  NOT NULL,
  PRIMARY KEY (version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin`); err != nil {
		return fmt.Errorf("migrate: create %s: %w", p.SchemaTable, err)
	}
	var applied []int
	if err := conn.SelectContext(ctx, &applied, "SELECT version FROM "+p.SchemaTable); err != nil {
		return fmt.Errorf("migrate: read %s: %w", p.SchemaTable, err)
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		for _, stmt := range Statements(m.SQL, r) {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("migrate %s: %w", m.Name, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT IGNORE INTO "+p.SchemaTable+" (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6))",
			m.Version, m.Name); err != nil {
			return fmt.Errorf("migrate %s: record version: %w", m.Name, err)
		}
	}
	return nil
}
