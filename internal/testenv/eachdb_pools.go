package testenv

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
)

// Session isolation levels for SessionIsolationDB, as SQL names them on
// both databases.
const (
	ReadUncommitted = "READ UNCOMMITTED"
	ReadCommitted   = "READ COMMITTED"
	RepeatableRead  = "REPEATABLE READ"
	Serializable    = "SERIALIZABLE"
)

// IsolationLevels are the four levels, weakest first.
var IsolationLevels = []string{ReadUncommitted, ReadCommitted, RepeatableRead, Serializable}

// SessionIsolationDB opens a second pool on db's database, with db's
// driver, whose sessions default to level (one of IsolationLevels): a DSN
// session parameter (MariaDB's tx_isolation or MySQL's
// transaction_isolation; PostgreSQL's default_transaction_isolation), so
// the server's global setting, shared with other tests, is never touched.
// It fails the test unless a new transaction on it really runs at level.
// PostgreSQL runs READ UNCOMMITTED as READ COMMITTED (it never reads
// uncommitted rows) but reports the level asked for.
func SessionIsolationDB(t testing.TB, db *sqlx.DB, level string) *sqlx.DB {
	t.Helper()
	want := strings.ToLower(level)
	if db.DriverName() != "mysql" {
		cfg, err := pgConfig()
		if err != nil {
			t.Fatalf("%v", err)
		}
		cfg.Database = DBName(t, db)
		if cfg.RuntimeParams == nil {
			cfg.RuntimeParams = map[string]string{}
		}
		cfg.RuntimeParams["default_transaction_isolation"] = want
		out := openPG(cfg)
		out.SetMaxOpenConns(16)
		t.Cleanup(func() { _ = out.Close() })
		var got string
		if err := out.Get(&got, "SELECT current_setting('transaction_isolation')"); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if got != want {
			t.Fatalf("testenv: session isolation is %s, want %s", got, want)
		}
		return out
	}
	value := strings.ToUpper(strings.ReplaceAll(want, " ", "-"))
	for _, v := range []string{"tx_isolation", "transaction_isolation"} {
		out := openVariant(t, db, func(c *mysql.Config) {
			if c.Params == nil {
				c.Params = map[string]string{}
			}
			c.Params[v] = "'" + value + "'"
		})
		var got string
		if err := out.Get(&got, "SELECT @@"+v); err != nil {
			continue
		}
		if got != value {
			t.Fatalf("testenv: session isolation is %s, want %s", got, value)
		}
		return out
	}
	t.Fatalf("testenv: could not open a %s session", level)
	return nil
}

// Reopen opens a second pool on db's database with db's driver (at most
// 16 connections), closed when the test ends: for a test that needs a
// pool of its own settings (SetMaxOpenConns(1), say) on the same data.
func Reopen(t testing.TB, db *sqlx.DB) *sqlx.DB {
	t.Helper()
	out, err := OpenDBRef(DBRef(t, db))
	if err != nil {
		t.Fatalf("%v", err)
	}
	out.SetMaxOpenConns(16)
	t.Cleanup(func() { _ = out.Close() })
	return out
}

// DBRef names db's database and its database server ("mysql/<name>" or
// "postgres/<name>"), for a child process (Child.Env) to open it with
// OpenDBRef.
func DBRef(t testing.TB, db *sqlx.DB) string {
	t.Helper()
	kind := DBMySQL
	if db.DriverName() != "mysql" {
		kind = DBPostgres
	}
	return kind + "/" + DBName(t, db)
}

// OpenDBRef opens the database DBRef named, on the test servers
// (RMQTX_MYSQL_* or RMQTX_PG_DSN).
func OpenDBRef(ref string) (*sqlx.DB, error) {
	kind, name, ok := strings.Cut(ref, "/")
	if !ok || name == "" {
		return nil, fmt.Errorf("testenv: database reference %q: want mysql/<name> or postgres/<name>", ref)
	}
	switch kind {
	case DBMySQL:
		s := Load()
		if err := s.CheckLoopback(); err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
		return sqlx.Open("mysql", s.DSN(name))
	case DBPostgres:
		cfg, err := pgConfig()
		if err != nil {
			return nil, err
		}
		cfg.Database = name
		return openPG(cfg), nil
	}
	return nil, fmt.Errorf("testenv: database reference %q: unknown server %q", ref, kind)
}

// OpenDBRefEnv is OpenDBRef of the reference in the environment variable
// env, for a crash child; it fails t when the variable is unset.
func OpenDBRefEnv(t testing.TB, env string) *sqlx.DB {
	t.Helper()
	ref := os.Getenv(env)
	if ref == "" {
		t.Fatalf("testenv: %s is not set", env)
	}
	db, err := OpenDBRef(ref)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// PoolVia opens a second pool on db's database that connects through addr
// (a CutProxy; a NewMySQLProxy for MySQL when the test loses a COMMIT's
// answer), closed when the test ends. It is DBVia for both databases.
func PoolVia(t testing.TB, db *sqlx.DB, addr string) *sqlx.DB {
	t.Helper()
	if db.DriverName() == "mysql" {
		return DBVia(t, db, addr)
	}
	cfg, err := pgConfig()
	if err != nil {
		t.Fatalf("%v", err)
	}
	cfg.Database = DBName(t, db)
	host, port, ok := strings.Cut(addr, ":")
	var p uint16
	if _, err := fmt.Sscan(port, &p); !ok || err != nil {
		t.Fatalf("testenv: proxy address %q", addr)
	}
	cfg.Host, cfg.Port, cfg.Fallbacks = host, p, nil
	out := openPG(cfg)
	out.SetMaxOpenConns(16)
	t.Cleanup(func() { _ = out.Close() })
	return out
}

// PGAddr is the PostgreSQL test server's host:port, for a CutProxy.
func PGAddr(t testing.TB) string {
	t.Helper()
	cfg, err := pgConfig()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

// ServerAddr is the host:port of db's server (MariaDB or PostgreSQL), for
// a CutProxy in front of it.
func ServerAddr(t testing.TB, db *sqlx.DB) string {
	t.Helper()
	if db.DriverName() == "mysql" {
		return Load().MySQLAddr
	}
	return PGAddr(t)
}

// LockWaiters counts the sessions on db's database that run a statement
// starting with prefix and (on PostgreSQL, which tells) wait for a lock:
// how a test sees that a statement is blocked on another transaction's row
// before it ends that transaction. MariaDB's process list does not say
// what a statement waits for; a statement that is still running there is
// counted. It returns the error instead of failing a test, for callers on
// goroutines other than the test's (a Send's local transaction function).
func LockWaiters(db *sqlx.DB, prefix string) (int, error) {
	q := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE ?"
	if db.DriverName() != "mysql" {
		q = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1"
	}
	var n int
	if err := db.Get(&n, q, prefix+"%"); err != nil {
		return 0, fmt.Errorf("testenv: lock waiters: %w", err)
	}
	return n, nil
}

// PGVariant opens a second pool on db's PostgreSQL database whose
// connection settings mod changes (a session TimeZone, pgx's query exec
// mode, ...), closed when the test ends. It is the PostgreSQL side of a
// test that runs over several DSN variants.
func PGVariant(t testing.TB, db *sqlx.DB, mod func(*pgx.ConnConfig)) *sqlx.DB {
	t.Helper()
	cfg, err := pgConfig()
	if err != nil {
		t.Fatalf("%v", err)
	}
	cfg.Database = DBName(t, db)
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	mod(cfg)
	out := openPG(cfg)
	out.SetMaxOpenConns(16)
	t.Cleanup(func() { _ = out.Close() })
	return out
}

// MySQLVariant is PGVariant for MariaDB: a second pool on db's database
// with the DSN settings mod changes.
func MySQLVariant(t testing.TB, db *sqlx.DB, mod func(*mysql.Config)) *sqlx.DB {
	t.Helper()
	return openVariant(t, db, mod)
}
