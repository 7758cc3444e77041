package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/schema"
)

// cmdMigrate creates or upgrades the rmqtx tables, or with --print writes
// the same plan as files for the team's own migration tool, without a
// database.
func cmdMigrate(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	flags := newFlags("migrate", stderr, &o, env)
	comps := flags.String("components", "all", "the components the service uses, comma separated: txlog, outbox, consumer, replay (replay brings consumer), or all")
	printOnly := flags.Bool("print", false, "do not migrate: write the plan as SQL files for golang-migrate, goose or Atlas (no database needed)")
	dialectName := flags.String("dialect", "", "with --print: the database, mysql (MySQL, MariaDB) or postgres (default: the form of the DSN, if one is set)")
	format := flags.String("format", string(schema.GolangMigrate), "with --print: the tool's file layout, golang-migrate, goose or atlas (for atlas, run atlas migrate hash after)")
	out := flags.String("out", "", "with --print: write the files to this directory (created if missing; steps already there are skipped, new files numbered after its highest), instead of stdout")
	pos, err := o.parse(flags, args)
	if err != nil {
		return 0, err
	}
	if len(pos) > 0 {
		return 0, usageErr("migrate takes no arguments")
	}
	cs, err := schema.ParseComponents(*comps)
	if err != nil {
		return 0, usageErr("--components: %v", errors.Unwrap(err))
	}
	opts := schema.Options{Prefix: o.prefix, Components: cs}
	if *printOnly {
		if err := o.validate(); err != nil {
			return 0, err
		}
		return printFiles(stdout, &o, opts, *dialectName, schema.Format(*format), *out)
	}
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, f := range []string{"dialect", "format", "out"} {
		if set[f] {
			return 0, usageErr("--%s goes with --print", f)
		}
	}
	done, err := opts.Resolved()
	if err != nil {
		return 0, usageErr("%v", err)
	}
	return o.withDB(ctx, func(ctx context.Context, db *sqlx.DB) (int, error) {
		if err := schema.Migrate(ctx, db, opts); err != nil {
			return 0, err
		}
		return exitOK, o.output(stdout, map[string]any{"migrated": done}, func() error {
			for _, d := range done {
				fmt.Fprintf(stdout, "migrated %s\n", d)
			}
			return nil
		})
	})
}

// printFiles writes schema.Files to stdout, or to the directory out.
func printFiles(stdout io.Writer, o *options, opts schema.Options, dialectName string, format schema.Format, out string) (int, error) {
	if dialectName == "" {
		switch {
		case o.dsn != "" && isPostgresDSN(o.dsn):
			dialectName = "postgres"
		case o.dsn != "":
			dialectName = "mysql"
		default:
			return 0, usageErr("--print needs --dialect mysql or postgres (or a DSN to take it from)")
		}
	}
	var existing []string
	if out != "" {
		entries, err := os.ReadDir(out)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, fmt.Errorf("read %s: %w", out, err)
		}
		for _, e := range entries {
			existing = append(existing, e.Name())
		}
	}
	files, err := schema.Files(schema.FilesOptions{Options: opts, Dialect: dialectName, Format: format, Existing: existing})
	if err != nil {
		if errors.Is(err, schema.ErrConfig) {
			return 0, usageErr("%v", err)
		}
		return 0, err
	}
	if out == "" {
		return exitOK, o.output(stdout, files, func() error {
			for _, f := range files {
				fmt.Fprintf(stdout, "-- ==== %s\n%s\n", f.Name, f.SQL)
			}
			return nil
		})
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return 0, err
	}
	var wrote []string
	for _, f := range files {
		p := filepath.Join(out, f.Name)
		// O_EXCL: a file of that name is never overwritten.
		w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return 0, err
		}
		if _, err := io.WriteString(w, f.SQL); err != nil {
			_ = w.Close()
			return 0, err
		}
		if err := w.Close(); err != nil {
			return 0, err
		}
		wrote = append(wrote, p)
	}
	return exitOK, o.output(stdout, map[string]any{"wrote": wrote}, func() error {
		if len(wrote) == 0 {
			fmt.Fprintf(stdout, "nothing to write: every step is in %s\n", out)
		}
		for _, p := range wrote {
			fmt.Fprintf(stdout, "wrote %s\n", p)
		}
		if format == schema.Atlas && len(wrote) > 0 {
			fmt.Fprintf(stdout, "run `atlas migrate hash` in %s to update atlas.sum\n", out)
		}
		return nil
	})
}
