package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dropdb"
)

// The databases EachDB runs a test body on, by subtest name.
const (
	DBMySQL    = "mysql"
	DBPostgres = "postgres"
)

// DBMarker starts the line MySQLDB and PostgresDB log (t.Log) for every
// database they create: "testenv: database mysql rmqtx_t_...". go test
// -json carries it in the test's output, where testguard reads it: a test
// whose stream shows one kind of database only fails the suite unless a
// one-db rule of scripts/test-names.txt says why it is about that one
// database. The marker is how a new integration test cannot run on one
// database silently; testguard keeps its own copy of the text (its test
// checks the two agree).
const DBMarker = "testenv: database "

// markDB logs DBMarker for a database of kind (DBMySQL or DBPostgres)
// that t uses.
func markDB(t testing.TB, kind, name string) {
	t.Helper()
	t.Log(DBMarker + kind + " " + name)
}

// EnvTestDB, set to DBPostgres, makes DB return a PostgreSQL database.
const EnvTestDB = "RMQTX_TEST_DB"

// EnvPGDSN holds the PostgreSQL test server's DSN, as `scripts/services.sh
// env` prints it. The default is the script's server.
const EnvPGDSN = "RMQTX_PG_DSN"

// DefaultPGDSN is the DSN of the server scripts/services.sh starts.
const DefaultPGDSN = "postgres://rmqtx:rmqtx@127.0.0.1:5433/rmqtx?sslmode=disable"

// PGDSN returns the PostgreSQL test server's DSN.
func PGDSN() string {
	if v := os.Getenv(EnvPGDSN); v != "" {
		return v
	}
	return DefaultPGDSN
}

// EachDB runs body once per database rmqtx supports, as the subtests
// "mysql" and "postgres", each with a fresh database of its own. A server
// that cannot be reached fails its subtest (only -short skips), so a body
// run on one database only is never mistaken for a run on both.
func EachDB(t *testing.T, body func(t *testing.T, db *sqlx.DB)) {
	t.Helper()
	t.Run(DBMySQL, func(t *testing.T) { body(t, MySQLDB(t)) })
	t.Run(DBPostgres, func(t *testing.T) { body(t, PostgresDB(t)) })
}

var (
	pgProbeOnce sync.Once
	pgProbeErr  error
)

// pgConfig parses the DSN and refuses any host that is not on loopback.
func pgConfig() (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(PGDSN())
	if err != nil {
		return nil, fmt.Errorf("testenv: %s: %w", EnvPGDSN, err)
	}
	hosts := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("testenv: %s host %q is not a loopback address; rmqtx's tests only talk to 127.0.0.1", EnvPGDSN, h)
		}
	}
	cfg.ConnectTimeout = 5 * time.Second
	return cfg, nil
}

func openPG(cfg *pgx.ConnConfig) *sqlx.DB {
	return sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx")
}

func probePG() error {
	cfg, err := pgConfig()
	if err != nil {
		return err
	}
	db := openPG(cfg)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("testenv: postgres at %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	return nil
}

// PostgresDB returns a connection pool (driver "pgx") to a fresh PostgreSQL
// database that is dropped when the test ends. Like Integration it skips
// under -short and fails when the server cannot be reached. It logs
// DBMarker: a test that calls it and never MySQLDB must run on both
// databases (EachDB) or have a one-db rule.
func PostgresDB(t testing.TB) *sqlx.DB {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs PostgreSQL; skipped in -short mode")
	}
	pgProbeOnce.Do(func() { pgProbeErr = probePG() })
	if pgProbeErr != nil {
		t.Fatalf("%v\n%s", pgProbeErr, HowToStart)
	}
	cfg, err := pgConfig()
	if err != nil {
		t.Fatalf("%v", err)
	}
	name := "rmqtx_t_" + RandSuffix(12)
	root := openPG(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := root.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		_ = root.Close()
		t.Fatalf("testenv: create database: %v\n%s", err, HowToStart)
	}
	markDB(t, DBPostgres, name)
	own := cfg.Copy()
	own.Database = name
	db := openPG(own)
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	t.Cleanup(func() {
		_ = db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if os.Getenv("RMQTX_KEEP_DB") == "" {
			// A connection a test leaked must not keep it alive, nor
			// an autovacuum worker (package dropdb).
			if err := dropdb.Drop(ctx, root, name, true); err != nil {
				t.Logf("testenv: %v (the database is left behind)", err)
			}
		} else {
			t.Logf("testenv: kept database %s", name)
		}
		_ = root.Close()
	})
	return db
}

// pgReadUncommittedDB is ReadUncommittedDB on PostgreSQL: a second pool on
// db's database whose sessions default to READ UNCOMMITTED.
func pgReadUncommittedDB(t testing.TB, db *sqlx.DB) *sqlx.DB {
	t.Helper()
	cfg, err := pgConfig()
	if err != nil {
		t.Fatalf("%v", err)
	}
	cfg.Database = DBName(t, db)
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["default_transaction_isolation"] = "read uncommitted"
	ru := openPG(cfg)
	ru.SetMaxOpenConns(16)
	t.Cleanup(func() { _ = ru.Close() })
	var level string
	if err := ru.Get(&level, "SELECT current_setting('transaction_isolation')"); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if level != "read uncommitted" {
		t.Fatalf("testenv: session isolation is %s, want read uncommitted", level)
	}
	return ru
}
