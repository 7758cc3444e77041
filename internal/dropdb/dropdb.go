// Package dropdb drops the scratch databases that tests and bench runs
// create, on MariaDB and PostgreSQL, without leaving one behind because a
// PostgreSQL autovacuum worker happened to be in it.
//
// PostgreSQL's DROP DATABASE ... WITH (FORCE) ends the sessions a run
// left connected, but a role that is not a superuser may not end an
// autovacuum worker with it: the statement fails with SQLSTATE 42501
// ("must be a member of the role whose process is being terminated"), and
// a run that wrote enough rows often has one at work when it ends. A plain
// DROP DATABASE ends autovacuum workers itself, and fails with 55006 when
// another session is still connected. So Drop tries one, then the other,
// until one succeeds or ctx ends. Before this package the bench logged the
// 42501 and left databases of gigabytes behind.
package dropdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Execer runs a statement: *sql.DB, *sqlx.DB and *sql.Conn are.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// nameRE is what a scratch database's name may be: it is concatenated into
// the statement, so nothing that needs quoting.
var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// retryEvery is how long Drop waits between two rounds on PostgreSQL.
const retryEvery = 100 * time.Millisecond

// SQLSTATEs after which another round may succeed (see the package doc).
const (
	pgInsufficientPrivilege = "42501" // FORCE met an autovacuum worker
	pgObjectInUse           = "55006" // a plain DROP met a session
)

// Drop drops database name, if it exists, through root, a connection to
// another database of the same server. postgres selects PostgreSQL's way
// (see the package doc); on MariaDB it is one DROP DATABASE IF EXISTS.
func Drop(ctx context.Context, root Execer, name string, postgres bool) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("dropdb: invalid database name %q", name)
	}
	q := "DROP DATABASE IF EXISTS " + name
	if !postgres {
		if _, err := root.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("dropdb: drop %s: %w", name, err)
		}
		return nil
	}
	for {
		var err error
		for _, stmt := range []string{q + " WITH (FORCE)", q} {
			if _, err = root.ExecContext(ctx, stmt); err == nil {
				return nil
			}
			if s := sqlState(err); s != pgInsufficientPrivilege && s != pgObjectInUse {
				return fmt.Errorf("dropdb: drop %s: %w", name, err)
			}
		}
		t := time.NewTimer(retryEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("dropdb: drop %s: %w (gave up: %w)", name, err, ctx.Err())
		case <-t.C:
		}
	}
}

// sqlState returns err's SQLSTATE (pgx's *pgconn.PgError has the method).
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}
