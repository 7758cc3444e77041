// Package migrate applies the embedded SQL migrations of rmqtx's table
// owners (txlog, outbox, consumer, replay) as one ordered plan: each owner
// is a Part with files named NNN_description.sql for the database's
// dialect, placeholders such as {{table}} or {{prefix}} replaced by
// validated names. Applied versions are recorded per part in one version
// table, each file with its version in one transaction, and concurrent runs
// are serialized with the dialect's named lock (held by the session across
// those transactions), so several processes may migrate at start-up. Script
// renders one step as a self-contained SQL file for a team's own migration
// tool: the step's statements and the version-table row Run would write,
// so Run later adopts a database that tool migrated. The schema package is
// the only caller outside the owners' own tests.
package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
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

// Part is one owner's share of the plan.
type Part struct {
	// Name keys the part's versions in the version table ("txlog").
	Name string
	// FS holds the part's NNN_*.sql files at its root, for the dialect.
	FS fs.FS
	// Replace maps placeholders to validated identifiers.
	Replace map[string]string
	// Legacy is the version table a release before the single plan kept
	// for this part ("" for none): its versions count as applied.
	Legacy string
}

// lockWait bounds the wait for another process's migration.
const lockWait = 60 * time.Second

// Run applies, part by part in the order given, the migrations that
// versionTable does not record yet. It is idempotent. Errors name the part
// and file; callers add their package prefix.
func Run(ctx context.Context, db *sqlx.DB, versionTable string, parts ...Part) error {
	d, err := dialect.For(db)
	if err != nil {
		return err
	}
	conn, err := db.Connx(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	release, err := d.Lock(ctx, conn, "rmqtx_migrate_"+versionTable, lockWait)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer release()
	if _, err := conn.ExecContext(ctx, createVersionTable(d, versionTable)); err != nil {
		return fmt.Errorf("migrate: create %s: %w", versionTable, err)
	}
	record := d.Rebind(d.InsertIgnore(versionTable, "part, version, name, applied_at", "?, ?, ?, "+d.Now(), "part, version"))
	for _, p := range parts {
		if err := runPart(ctx, conn, d, versionTable, record, p); err != nil {
			return fmt.Errorf("migrate %s: %w", p.Name, err)
		}
	}
	return nil
}

// replacer fills the part's placeholders.
func (p Part) replacer() *strings.Replacer {
	pairs := make([]string, 0, 2*len(p.Replace))
	for k, v := range p.Replace {
		pairs = append(pairs, k, v)
	}
	return strings.NewReplacer(pairs...)
}

func runPart(ctx context.Context, conn *sqlx.Conn, d dialect.Dialect, versionTable, record string, p Part) error {
	ms, err := Load(p.FS, ".")
	if err != nil {
		return err
	}
	r := p.replacer()
	var applied []int
	if err := conn.SelectContext(ctx, &applied, d.Rebind("SELECT version FROM "+versionTable+" WHERE part = ?"), p.Name); err != nil {
		return fmt.Errorf("read %s: %w", versionTable, err)
	}
	if len(applied) == 0 && p.Legacy != "" {
		// A database created before the single plan: adopt the versions
		// its own version table recorded, once. The old table stays.
		legacy, err := legacyVersions(ctx, conn, d, p.Legacy)
		if err != nil {
			return err
		}
		for _, m := range ms {
			if legacy[m.Version] {
				if _, err := conn.ExecContext(ctx, record, p.Name, m.Version, m.Name); err != nil {
					return fmt.Errorf("adopt %s version %d: %w", p.Legacy, m.Version, err)
				}
				applied = append(applied, m.Version)
			}
		}
	}
	done := make(map[int]bool, len(applied))
	for _, v := range applied {
		done[v] = true
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if err := apply(ctx, conn, m, Statements(m.SQL, r), record, p.Name); err != nil {
			return err
		}
	}
	return nil
}

// apply runs one migration file and records its version in one
// transaction. Where DDL is transactional (PostgreSQL) a failed file leaves
// nothing behind and a file is never recorded without its effect; where
// DDL commits implicitly (MySQL) the transaction adds nothing, and the
// files' IF NOT EXISTS make running a half-applied file again safe.
func apply(ctx context.Context, conn *sqlx.Conn, m Migration, stmts []string, record, part string) error {
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", m.Name, err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, stmt := range stmts {
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return fmt.Errorf("%s: %w", m.Name, err)
		}
	}
	if _, err := tx.ExecContext(ctx, record, part, m.Version, m.Name); err != nil {
		return fmt.Errorf("%s: record version: %w", m.Name, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", m.Name, err)
	}
	return nil
}

// legacyVersions reads the versions of a pre-plan version table, none when
// it does not exist.
func legacyVersions(ctx context.Context, conn *sqlx.Conn, d dialect.Dialect, table string) (map[int]bool, error) {
	var n int
	if err := conn.GetContext(ctx, &n, d.Rebind(d.TableExistsQuery()), table); err != nil {
		return nil, fmt.Errorf("look for %s: %w", table, err)
	}
	out := map[int]bool{}
	if n == 0 {
		return out, nil
	}
	var vs []int
	if err := conn.SelectContext(ctx, &vs, "SELECT version FROM "+table); err != nil {
		return nil, fmt.Errorf("read %s: %w", table, err)
	}
	for _, v := range vs {
		out[v] = true
	}
	return out, nil
}

func createVersionTable(d dialect.Dialect, table string) string {
	return "CREATE TABLE IF NOT EXISTS " + table + ` (
  part       VARCHAR(64)  NOT NULL,
  version    INT          NOT NULL,
  name       VARCHAR(255) NOT NULL,
  applied_at ` + d.TimestampType() + ` NOT NULL,
  PRIMARY KEY (part, version)
)` + d.TableOptions()
}

// Script renders migration m of part p as one SQL script that a plain client
// or another migration tool can run as it is: the step's statements with the
// placeholders filled, then the version table (created if missing) and the
// row Run records for the step, written only if missing. A database
// migrated by such scripts is adopted by Run: it finds the rows and runs no
// step again. Statements end with ";" at the end of a line.
func Script(d dialect.Dialect, versionTable string, p Part, m Migration) (string, error) {
	part, err := literal(p.Name)
	if err != nil {
		return "", err
	}
	name, err := literal(m.Name)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, stmt := range Statements(m.SQL, p.replacer()) {
		b.WriteString(stmt)
		b.WriteString(";\n\n")
	}
	b.WriteString("-- rmqtx records the step, as its own runner does, so that it never runs it again.\n")
	b.WriteString(createVersionTable(d, versionTable))
	b.WriteString(";\n")
	b.WriteString(d.InsertIgnore(versionTable, "part, version, name, applied_at",
		part+", "+strconv.Itoa(m.Version)+", "+name+", "+d.Now(), "part, version"))
	b.WriteString(";\n")
	return b.String(), nil
}

// literal quotes s as an SQL string literal. Only the characters of part
// and file names are accepted, so no quoting rule of either database can
// matter.
func literal(s string) (string, error) {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == ' ' || r == '-') {
			return "", fmt.Errorf("migrate: %q: not a part or file name", s)
		}
	}
	return "'" + s + "'", nil
}
