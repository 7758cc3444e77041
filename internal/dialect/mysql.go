package dialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// MySQL is the dialect of MySQL 8 and MariaDB 10.6 or later.
var MySQL Dialect = mysqlDialect{}

type mysqlDialect struct{}

// Server error numbers (MySQL and MariaDB share them).
const (
	erDupEntry            = 1062
	erLockWaitTimeout     = 1205
	erLockDeadlock        = 1213
	erNoSuchTable         = 1146
	erUnknownSystemVar    = 1193
	erUnsupportedPS       = 1295 // ER_UNSUPPORTED_PS
	erMaxPreparedStmtCnt  = 1461 // ER_MAX_PREPARED_STMT_COUNT_REACHED
	erLockAbortedDeadlock = 1614 // ER_XA_RBDEADLOCK
)

func (mysqlDialect) Name() string               { return "mysql" }
func (mysqlDialect) Rebind(query string) string { return query }
func (mysqlDialect) Now() string                { return "UTC_TIMESTAMP(6)" }
func (mysqlDialect) NowPlusMicros() string      { return "UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND" }
func (mysqlDialect) MicrosSince(expr string) string {
	return "TIMESTAMPDIFF(MICROSECOND, " + expr + ", UTC_TIMESTAMP(6))"
}

func (mysqlDialect) InsertIgnore(table, columns, values, conflict string) string {
	return "INSERT IGNORE INTO " + table + " (" + columns + ") VALUES " + wrapValues(values)
}

func (mysqlDialect) Upsert(table, columns, values, conflict, set string) string {
	return "INSERT INTO " + table + " (" + columns + ") VALUES " + wrapValues(values) + " ON DUPLICATE KEY UPDATE " + set
}

func (mysqlDialect) Excluded(column string) string { return "VALUES(" + column + ")" }

func (mysqlDialect) DeleteLimit(table, where, orderBy, key string) string {
	return "DELETE FROM " + table + " WHERE " + where + " ORDER BY " + orderBy + " LIMIT ?"
}

func (mysqlDialect) CreateTableLike(dst, src string) string {
	return "CREATE TABLE IF NOT EXISTS " + dst + " LIKE " + src
}

func (mysqlDialect) CopyReplacing(dst, src, where, key string) string {
	return "REPLACE INTO " + dst + " SELECT * FROM " + src + " WHERE " + where
}

func (mysqlDialect) SharedLock() string { return "LOCK IN SHARE MODE" }

// MySQL 8 and MariaDB 11.1+ know transaction_isolation; MariaDB before 11.1
// only tx_isolation.
func (mysqlDialect) IsolationExprs() []string {
	return []string{"@@SESSION.transaction_isolation", "@@SESSION.tx_isolation"}
}

func (mysqlDialect) ReadUncommitted(level string) bool {
	return strings.EqualFold(level, "READ-UNCOMMITTED")
}

func (mysqlDialect) TimestampType() string { return "DATETIME(6)" }
func (mysqlDialect) TableOptions() string {
	return " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
}

func (mysqlDialect) TableExistsQuery() string {
	return "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?"
}

func (mysqlDialect) Lock(ctx context.Context, conn *sqlx.Conn, name string, wait time.Duration) (func(), error) {
	var got sql.NullInt64
	if err := conn.GetContext(ctx, &got, "SELECT GET_LOCK(?, ?)", name, int(wait.Seconds())); err != nil {
		return nil, fmt.Errorf("dialect: lock %s: %w", name, err)
	}
	if !got.Valid || got.Int64 != 1 {
		return nil, fmt.Errorf("dialect: could not take lock %s within %s", name, wait)
	}
	return func() {
		// Release on a fresh context: the caller's may be done.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = conn.ExecContext(rctx, "SELECT RELEASE_LOCK(?)", name)
	}, nil
}

func (mysqlDialect) InsertID(ctx context.Context, e sqlx.ExtContext, insert, idColumn string, args ...any) (int64, error) {
	res, err := e.ExecContext(ctx, insert, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

func mysqlNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

func (mysqlDialect) IsDuplicateKey(err error) bool { return mysqlNumber(err) == erDupEntry }
func (mysqlDialect) IsDeadlock(err error) bool {
	n := mysqlNumber(err)
	return n == erLockDeadlock || n == erLockAbortedDeadlock
}
func (mysqlDialect) IsLockTimeout(err error) bool     { return mysqlNumber(err) == erLockWaitTimeout }
func (mysqlDialect) IsMissingTable(err error) bool    { return mysqlNumber(err) == erNoSuchTable }
func (mysqlDialect) IsUnknownVariable(err error) bool { return mysqlNumber(err) == erUnknownSystemVar }

func (mysqlDialect) IsPrepareRefused(err error) bool {
	n := mysqlNumber(err)
	return n == erMaxPreparedStmtCnt || n == erUnsupportedPS
}

// wrapValues puts one row of values in parentheses; a list of rows
// ("(...), (...)") is left as it is.
func wrapValues(values string) string {
	if strings.HasPrefix(strings.TrimSpace(values), "(") {
		return values
	}
	return "(" + values + ")"
}

// UpsertReturning hands the value back through LAST_INSERT_ID(expr), which
// sets the statement's insert id, in an assignment that leaves the first
// conflict column as it is (it comes last, so expr sees the row after set).
// RowsReturning: MySQL returns no rows from an INSERT, UPDATE or DELETE.
func (mysqlDialect) RowsReturning(query, _ string) (string, bool) { return query, false }

func (mysqlDialect) UpsertReturning(table, columns, values, conflict, set, returning string) string {
	key, _, _ := strings.Cut(conflict, ",")
	key = strings.TrimSpace(key)
	return "INSERT INTO " + table + " (" + columns + ") VALUES " + wrapValues(values) + " ON DUPLICATE KEY UPDATE " + set +
		", " + key + " = IF(LAST_INSERT_ID(" + returning + ") IS NULL, " + key + ", " + key + ")"
}

// ExecReturning reads the rows affected (1: inserted; 2: an existing row
// changed, which set guarantees) and the insert id.
func (mysqlDialect) ExecReturning(ctx context.Context, e ReturningExecer, query string, args ...any) (bool, int64, error) {
	res, err := e.ExecContext(ctx, query, args...)
	if err != nil {
		return false, 0, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, 0, fmt.Errorf("dialect: upsert: %w", err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return false, 0, fmt.Errorf("dialect: upsert: %w", err)
	}
	switch n {
	case 1:
		return true, id, nil
	case 2:
		return false, id, nil
	}
	return false, 0, fmt.Errorf("dialect: upsert: %d rows affected, want 1 or 2", n)
}

// IdleTransactionLimit uses the session's wait_timeout, which the server
// applies to every wait for the client's next statement, in a transaction or
// not (MariaDB's idle_transaction_timeout would serve too; MySQL has none).
// set keeps the session's own value in a user variable, and reset restores
// it, so a pooled connection goes back to its pool as it came.
func (mysqlDialect) IdleTransactionLimit(limit time.Duration) (string, string) {
	secs := max(int64(math.Ceil(limit.Seconds())), 1) // whole seconds, at least 1
	return "SET @rmqtx_wait_timeout = @@SESSION.wait_timeout, SESSION wait_timeout = " + strconv.FormatInt(secs, 10),
		"SET SESSION wait_timeout = @rmqtx_wait_timeout"
}

// SHA256Hex converts SHA2's result, in the connection's character set, to
// ASCII so it compares with an ASCII hash column whatever that set is.
func (mysqlDialect) SHA256Hex(expr string) string {
	return "CONVERT(SHA2(" + expr + ", 256) USING ascii)"
}

// InsertNew is a plain INSERT: on MySQL a duplicate-key error rolls back
// the statement, not the transaction.
func (mysqlDialect) InsertNew(table, columns, values, conflict string) string {
	return "INSERT INTO " + table + " (" + columns + ") VALUES " + wrapValues(values)
}

// NewKeysByInsertNew: UpsertReturning is one Exec here (see Dialect).
func (mysqlDialect) NewKeysByInsertNew() bool { return false }

func (mysqlDialect) DriverPrepares() bool { return false }

// ExecInsertNew reads the duplicate-key error as "not inserted".
func (d mysqlDialect) ExecInsertNew(ctx context.Context, e sqlx.ExecerContext, query string, args ...any) (bool, error) {
	if _, err := e.ExecContext(ctx, query, args...); err != nil {
		if d.IsDuplicateKey(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// LatestCommitted runs write on db: InnoDB's locking reads and writes see
// the latest committed version at every isolation level.
func (mysqlDialect) LatestCommitted(ctx context.Context, db *sqlx.DB, write func(ctx context.Context, e sqlx.ExtContext) error) error {
	return write(ctx, db)
}
