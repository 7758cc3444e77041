package schema

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/migrate"
)

// Format is the file layout of a migration tool Files writes for.
type Format string

// The formats Files writes.
const (
	// GolangMigrate: NNNNNN_name.up.sql (github.com/golang-migrate/migrate).
	// No down files: rmqtx's steps are not undone. On MySQL the tool runs a
	// file as one multi-statement Exec: with a *sql.DB of your own, open it
	// with multiStatements=true (the tool's mysql:// URL does that itself).
	GolangMigrate Format = "golang-migrate"
	// Goose: NNNNN_name.sql starting with "-- +goose Up"
	// (github.com/pressly/goose). The steps hold no PL/pgSQL, so no
	// StatementBegin/End is needed: every statement ends with ";" at the end
	// of a line.
	Goose Format = "goose"
	// Atlas: NNNNNNNNNNNNNN_name.sql, fourteen digits so that they sort with
	// Atlas's timestamp versions (atlas migrate apply). Atlas checks the
	// directory against atlas.sum: run `atlas migrate hash` after adding the
	// files.
	Atlas Format = "atlas"
)

// Formats returns every Format Files writes.
func Formats() []Format { return []Format{GolangMigrate, Goose, Atlas} }

// File is one migration file: its name in the tool's directory and its text.
type File struct {
	Name string
	SQL  string
}

// FilesOptions says which files Files writes.
type FilesOptions struct {
	// Options: the prefix and the components, as for Migrate.
	Options
	// Dialect is the database: "mysql" (MySQL and MariaDB) or "postgres".
	Dialect string
	// Format is the tool's layout; "" means GolangMigrate.
	Format Format
	// Existing are the names of the files already in the tool's directory,
	// the service's own and those rmqtx wrote before. rmqtx steps already
	// there are not written again, and the new files are numbered after the
	// highest number there, so that a tool which applies only versions
	// above its last one (golang-migrate, Atlas) applies them: a component
	// added later, or the steps of a newer rmqtx release, come after
	// everything already applied.
	Existing []string
}

// Files returns the plan of o as numbered SQL files for a migration tool, in
// the order to apply them: one file per step of each component. Each file
// holds the step's statements, table names filled in, then creates the
// version table <prefix>schema_migrations if missing and records the step
// in it, as Migrate would. So the tool, or any client that runs the files
// in order, leaves the database exactly as Migrate does, and Migrate, run
// later (by the service at start-up, or `rmqtx migrate`), finds every step
// recorded and runs none again: the two ways can be mixed and switched.
//
// Numbers are assigned from 1, or after the highest number among
// o.Existing. File names carry the prefix and the step
// (000001_rmqtx_txlog_001_create_txlog.up.sql), so the files of several
// prefixes can share a directory. Errors wrap ErrConfig.
func Files(o FilesOptions) ([]File, error) {
	d, err := dialectNamed(o.Dialect)
	if err != nil {
		return nil, err
	}
	format := o.Format
	if format == "" {
		format = GolangMigrate
	}
	name, err := namer(format)
	if err != nil {
		return nil, err
	}
	prefix, ps, err := o.resolve()
	if err != nil {
		return nil, err
	}
	pl, err := plan(d.Name(), prefix, ps)
	if err != nil {
		return nil, err
	}
	have := map[string]bool{}
	next := 1
	for _, e := range o.Existing {
		e = path.Base(e)
		num, rest, ok := strings.Cut(e, "_")
		n, err := strconv.Atoi(num)
		if !ok || err != nil {
			continue // atlas.sum, a README, ...
		}
		have[rest] = true
		next = max(next, n+1)
	}
	var out []File
	for i, p := range pl {
		ms, err := migrate.Load(p.FS, ".")
		if err != nil {
			return nil, fmt.Errorf("schema: %s: %w", ps[i].component, err)
		}
		for _, m := range ms {
			stem := prefix + string(ps[i].component) + "_" + strings.TrimSuffix(m.Name, ".sql")
			if _, rest, _ := strings.Cut(name(0, stem), "_"); have[rest] {
				continue
			}
			script, err := migrate.Script(d, prefix+VersionTable, p, m)
			if err != nil {
				return nil, fmt.Errorf("schema: %s: %w", ps[i].component, err)
			}
			head := fmt.Sprintf("-- rmqtx %s step %03d (%s) for %s, table prefix %s.\n"+
				"-- Written by rmqtx's schema.Files: do not edit; the step is recorded in %s%s.\n\n",
				ps[i].component, m.Version, m.Name, d.Name(), prefix, prefix, VersionTable)
			if format == Goose {
				head = "-- +goose Up\n" + head
			}
			out = append(out, File{Name: name(next, stem), SQL: head + script})
			next++
		}
	}
	return out, nil
}

// namer returns the file name of step number n with the name stem.
func namer(f Format) (func(n int, stem string) string, error) {
	switch f {
	case GolangMigrate:
		return func(n int, stem string) string { return fmt.Sprintf("%06d_%s.up.sql", n, stem) }, nil
	case Goose:
		return func(n int, stem string) string { return fmt.Sprintf("%05d_%s.sql", n, stem) }, nil
	case Atlas:
		return func(n int, stem string) string { return fmt.Sprintf("%014d_%s.sql", n, stem) }, nil
	}
	return nil, fmt.Errorf("%w: unknown format %q (want golang-migrate, goose or atlas)", ErrConfig, f)
}

// dialectNamed returns the dialect called name ("mysql", "postgres").
func dialectNamed(name string) (dialect.Dialect, error) {
	var names []string
	for _, d := range dialect.All() {
		if d.Name() == name {
			return d, nil
		}
		names = append(names, d.Name())
	}
	return nil, fmt.Errorf("%w: unknown dialect %q (want %s)", ErrConfig, name, strings.Join(names, " or "))
}
