package main

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dropdb"
)

// The example's business SQL is user code: written by hand for each
// database it runs on, as a service would write it. Most statements are
// the same on both (each passes through sqlx's Rebind, which turns ? into
// $1, $2, ... for PostgreSQL); the few that are not are chosen by driver
// here. rmqtx's own calls are the same on both databases.

//go:embed schema_mysql.sql
var schemaMySQL string

//go:embed schema_postgres.sql
var schemaPostgres string

// Engines the demo runs on.
const (
	EngineMySQL    = "mysql"    // MySQL or MariaDB, go-sql-driver/mysql
	EnginePostgres = "postgres" // PostgreSQL, pgx's database/sql driver "pgx"
)

// bizSQL is the business SQL that differs between the databases.
type bizSQL struct {
	schema    string
	currentDB string // the connection's database
	// seedUser inserts a user unless it exists.
	seedUser string
	// addPoints adds to a user's balance, creating the row.
	addPoints string
	// upsertSearch writes the whole projection row.
	upsertSearch string
	// listDemoDBs lists the demo databases.
	listDemoDBs string
}

var mysqlSQL = bizSQL{
	schema:    schemaMySQL,
	currentDB: `SELECT DATABASE()`,
	seedUser:  `INSERT IGNORE INTO users (id, name, phone) VALUES (?, ?, ?)`,
	addPoints: `INSERT INTO points_balance (user_id, points, updated_at) VALUES (?, ?, ?)
		ON DUPLICATE KEY UPDATE points = points + VALUES(points), updated_at = VALUES(updated_at)`,
	upsertSearch: `INSERT INTO order_search (order_id, user_id, amount_cents, currency, status, version, event_id, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON DUPLICATE KEY UPDATE user_id = VALUES(user_id), amount_cents = VALUES(amount_cents), currency = VALUES(currency),
			status = VALUES(status), version = VALUES(version), event_id = VALUES(event_id), updated_at = VALUES(updated_at)`,
	listDemoDBs: `SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE 'rmqtx\_demo\_%'`,
}

var postgresSQL = bizSQL{
	schema:    schemaPostgres,
	currentDB: `SELECT current_database()`,
	seedUser:  `INSERT INTO users (id, name, phone) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING`,
	addPoints: `INSERT INTO points_balance (user_id, points, updated_at) VALUES (?, ?, ?)
		ON CONFLICT (user_id) DO UPDATE SET points = points_balance.points + EXCLUDED.points, updated_at = EXCLUDED.updated_at`,
	upsertSearch: `INSERT INTO order_search (order_id, user_id, amount_cents, currency, status, version, event_id, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (order_id) DO UPDATE SET user_id = EXCLUDED.user_id, amount_cents = EXCLUDED.amount_cents,
			currency = EXCLUDED.currency, status = EXCLUDED.status, version = EXCLUDED.version,
			event_id = EXCLUDED.event_id, updated_at = EXCLUDED.updated_at`,
	listDemoDBs: `SELECT datname FROM pg_database WHERE datname LIKE 'rmqtx\_demo\_%'`,
}

// sqlFor returns the business SQL for a connection's driver name.
func sqlFor(driverName string) bizSQL {
	if driverName == "pgx" {
		return postgresSQL
	}
	return mysqlSQL
}

// engineOf names the database behind db.
func engineOf(db *sqlx.DB) string {
	if db.DriverName() == "pgx" {
		return EnginePostgres
	}
	return EngineMySQL
}

// parseEngine accepts the names a user types for the two databases.
func parseEngine(s string) (string, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "mysql", "mariadb":
		return EngineMySQL, nil
	case "postgres", "postgresql", "pg":
		return EnginePostgres, nil
	}
	return "", fmt.Errorf("unknown database engine %q (mysql or postgres)", s)
}

// isLockConflict reports an error after which the database rolled the
// transaction back and running it again may succeed: a MySQL/MariaDB
// deadlock (1213) or lock wait timeout (1205); a PostgreSQL deadlock
// (40P01), serialization failure (40001) or lock timeout (55P03).
func isLockConflict(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1213 || me.Number == 1205
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "40P01" || pe.Code == "40001" || pe.Code == "55P03"
	}
	return false
}

// defaultPGDSN is the PostgreSQL server scripts/services.sh starts.
const defaultPGDSN = "postgres://rmqtx:rmqtx@127.0.0.1:5433/rmqtx?sslmode=disable"

// pgDSN is RMQTX_PG_DSN (scripts/services.sh env prints it), or the local
// server's.
func pgDSN() string {
	if v := os.Getenv("RMQTX_PG_DSN"); v != "" {
		return v
	}
	return defaultPGDSN
}

// openDB opens database name ("" for the server's default: the one the
// settings name) on engine. Every address must be on loopback.
func openDB(engine string, s Settings, name string) (*sqlx.DB, error) {
	if engine != EnginePostgres {
		return sqlx.Open("mysql", s.DSN(name))
	}
	cfg, err := pgx.ParseConfig(pgDSN())
	if err != nil {
		return nil, errors.New("RMQTX_PG_DSN cannot be parsed")
	}
	if ip := net.ParseIP(cfg.Host); ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("RMQTX_PG_DSN host %q is not a loopback address; the demo only talks to 127.0.0.1", cfg.Host)
	}
	if name != "" {
		cfg.Database = name
	}
	return sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx"), nil
}

// serverAddr names the server of engine, for messages.
func serverAddr(engine string, s Settings) string {
	if engine != EnginePostgres {
		return s.MySQLAddr
	}
	if cfg, err := pgx.ParseConfig(pgDSN()); err == nil {
		return net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port))
	}
	return "RMQTX_PG_DSN"
}

// createDemoDB creates an empty database for one run.
func createDemoDB(ctx context.Context, root *sqlx.DB, name string) error {
	q := "CREATE DATABASE " + name
	if engineOf(root) == EngineMySQL {
		q += " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
	}
	_, err := root.ExecContext(ctx, q)
	return err
}

// dropDemoDB drops a demo database; on PostgreSQL neither the sessions
// still connected to it (a crashed run's pool) nor an autovacuum worker
// keep it (package dropdb), for at most 30 s.
func dropDemoDB(ctx context.Context, root *sqlx.DB, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return dropdb.Drop(ctx, root, name, engineOf(root) == EnginePostgres)
}
