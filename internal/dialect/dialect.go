// Package dialect is the seam between rmqtx's table owners (txlog, outbox,
// consumer, replay) and the database they run on. An owner writes its own
// SQL in the portable subset (ANSI joins, CASE, COALESCE, FOR UPDATE SKIP
// LOCKED, "?" placeholders) and asks its Dialect for the few pieces that
// differ between databases: placeholders, upserts and insert-ignore, "now"
// on the database clock, interval arithmetic, a bounded delete, the
// session's isolation level, the migration lock, and the classification of
// duplicate-key, deadlock and lock-timeout errors.
//
// The seam follows River's riverdriver in spirit, not in size: the owners
// keep their queries and their logic, so a second database is one new
// implementation of Dialect plus a migrations folder per owner, not a copy
// of every query. MySQL and MariaDB are the first implementation (MySQL).
//
// Only this package and the owners' migration files may hold SQL that is
// not portable; schema's seams test enforces it.
package dialect

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// Dialect is what an owner needs from a database beyond portable SQL. Every
// method that returns SQL text returns it with "?" placeholders; owners pass
// the whole statement through Rebind once, when they build it.
type Dialect interface {
	// Name names the dialect and the folder of each owner's migrations
	// ("mysql", "postgres").
	Name() string

	// Rebind turns the "?" placeholders of query into the database's own.
	Rebind(query string) string

	// Now is an expression for the current time on the database's clock,
	// in UTC, with microseconds, as the owners' timestamp columns hold it.
	Now() string
	// NowPlusMicros is Now() plus a bound number of microseconds (one "?").
	NowPlusMicros() string
	// MicrosSince is the whole number of microseconds from the timestamp
	// expression expr to Now().
	MicrosSince(expr string) string

	// InsertIgnore is an INSERT of columns (comma-separated) with the value
	// list values ("?, ?, ..." or several "(...)" rows, parentheses
	// included) that does nothing when it meets an existing row with the
	// same key (the unique key conflict, comma-separated columns).
	InsertIgnore(table, columns, values, conflict string) string
	// Upsert is an INSERT that, on a conflict on the key conflict, updates
	// the existing row with the assignments of set, in which Excluded(c)
	// names the value the INSERT proposed for column c, and a bare name of
	// one of columns the existing row's value (a dialect where a bare name
	// would be ambiguous qualifies those names itself; a column outside
	// columns cannot be read by its bare name there).
	Upsert(table, columns, values, conflict, set string) string
	// Excluded names, inside an Upsert's set, the value the INSERT proposed
	// for column.
	Excluded(column string) string

	// DeleteLimit deletes at most "?" rows of table matching where (whose
	// own placeholders come first), oldest first by orderBy; key is the
	// table's primary key column list, for databases that cannot order a
	// DELETE.
	DeleteLimit(table, where, orderBy, key string) string

	// CreateTableLike creates table dst with the columns and keys of src,
	// unless it exists.
	CreateTableLike(dst, src string) string
	// CopyReplacing copies the rows of src matching where into dst (same
	// columns), replacing rows of dst with the same key (key: the primary
	// key's comma-separated columns).
	CopyReplacing(dst, src, where, key string) string

	// SharedLock is the clause that makes a SELECT take shared row locks.
	SharedLock() string

	// IsolationExprs are expressions for the session's isolation level, in
	// the order to try them: an owner that gets IsUnknownVariable on one
	// moves to the next.
	IsolationExprs() []string
	// ReadUncommitted reports whether level, as an IsolationExprs
	// expression returned it, is READ UNCOMMITTED.
	ReadUncommitted(level string) bool

	// TimestampType is the column type of a UTC timestamp with
	// microseconds; TableOptions ends a CREATE TABLE (engine, charset).
	TimestampType() string
	TableOptions() string

	// TableExistsQuery is a query with one "?" (the table name) that
	// returns the number of tables of that name in the current database.
	TableExistsQuery() string

	// Lock takes a named lock on conn, waiting at most wait, and returns
	// its release. Migrations serialize with it.
	Lock(ctx context.Context, conn *sqlx.Conn, name string, wait time.Duration) (release func(), err error)

	// InsertID runs insert (one row into a table whose key is the
	// auto-generated integer column idColumn) on e and returns the new
	// row's id: the driver's last insert id here, a RETURNING clause on
	// databases that have no such id.
	InsertID(ctx context.Context, e sqlx.ExtContext, insert, idColumn string, args ...any) (int64, error)

	// Errors.
	IsDuplicateKey(err error) bool
	// IsDeadlock reports a deadlock or serialization failure: the
	// database rolled the transaction back, and running it again whole
	// may succeed.
	IsDeadlock(err error) bool
	// IsLockTimeout reports a lock wait that timed out.
	IsLockTimeout(err error) bool
	// IsMissingTable reports a statement on a table that does not exist.
	IsMissingTable(err error) bool
	// IsUnknownVariable reports an IsolationExprs expression the server
	// does not know.
	IsUnknownVariable(err error) bool
	// IsPrepareRefused reports an error after which a statement should run
	// unprepared (the server's prepared-statement limit, or a statement
	// kind it will not prepare).
	IsPrepareRefused(err error) bool

	// UpsertReturning is an Upsert that, in the same one statement, also
	// tells an insert from an update and yields one integer: for a row
	// the INSERT met, the integer expression returning evaluated on that
	// row after set (its "?" placeholders bind after those of values and
	// set); for an inserted row, the new auto-increment key when returning
	// is the table's auto-increment column (e.g. "id"), otherwise nothing
	// to rely on. set must change the row it meets, so that an update is
	// told from an insert whatever the driver's found-rows flag says. It
	// saves the read a duplicate would otherwise cost. Run it with
	// ExecReturning. PostgreSQL form:
	//	INSERT INTO table (columns) VALUES (values) ON CONFLICT (conflict)
	//	DO UPDATE SET set RETURNING (xmax = 0), returning
	UpsertReturning(table, columns, values, conflict, set, returning string) string
	// RowsReturning appends a RETURNING clause listing returning to query
	// (an INSERT, UPDATE or DELETE) and reports true where the database
	// returns rows from such a statement; where it cannot (MySQL), it
	// returns query unchanged and false, and the owner reads the rows with
	// a SELECT of its own.
	RowsReturning(query, returning string) (string, bool)
	// ExecReturning runs query, an UpsertReturning statement, on e and
	// returns whether it inserted the row and the integer it yielded
	// (MySQL reads the statement's result; PostgreSQL scans the row its
	// RETURNING clause gives).
	ExecReturning(ctx context.Context, e ReturningExecer, query string, args ...any) (inserted bool, value int64, err error)

	// IdleTransactionLimit bounds, on the server, how long a client that
	// stopped (paused, partitioned, hung) keeps an open transaction and its
	// row locks: no client-side deadline can, since the client is not
	// running. set, run inside the transaction, makes the server end the
	// session (rolling the transaction back) once it has waited longer than
	// limit for the client's next statement; reset, run on the same
	// connection once the transaction has ended, undoes it ("" when set ends
	// with the transaction). Neither has placeholders. PostgreSQL:
	//	SET LOCAL idle_in_transaction_session_timeout = <milliseconds>; reset ""
	IdleTransactionLimit(limit time.Duration) (set, reset string)

	// SHA256Hex is an expression for the SHA-256 digest of the bytes of
	// expr (a binary column), as 64 lower-case hex characters: what
	// wire.Hash computes in Go, for comparing a stored payload with its
	// stored hash inside a query. PostgreSQL: encode(sha256(expr), 'hex').
	SHA256Hex(expr string) string

	// InsertNew is an INSERT of one row (columns and values as for
	// InsertIgnore) into a caller's transaction that reports a row with the
	// same key (the unique key conflict) without ending that transaction:
	// the caller may go on and commit its other work. Run it with
	// ExecInsertNew. Unlike InsertIgnore it refuses bad data as a plain
	// INSERT does (MySQL's IGNORE also turns data errors into warnings).
	// MySQL: a plain INSERT, whose duplicate-key error ends the statement
	// only. PostgreSQL, where any error aborts the whole transaction:
	//	INSERT INTO table (columns) VALUES (values) ON CONFLICT (conflict) DO NOTHING
	InsertNew(table, columns, values, conflict string) string
	// ExecInsertNew runs query, an InsertNew statement, on e and reports
	// whether it inserted the row (false: the key exists). Any other error
	// is returned as it is.
	ExecInsertNew(ctx context.Context, e sqlx.ExecerContext, query string, args ...any) (inserted bool, err error)
	// NewKeysByInsertNew reports whether a writer whose keys are nearly
	// always new (the consumer's dedup row) should record them with
	// InsertNew and read the existing row only after a conflict, rather
	// than with one UpsertReturning that also answers a conflict. MySQL:
	// false (UpsertReturning is one Exec whose rows affected and insert id
	// carry the answer, where InsertNew's duplicate-key error would cost an
	// error and a read). PostgreSQL: true (ON CONFLICT DO UPDATE ...
	// RETURNING costs the server 5-9 µs more per new key than DO NOTHING,
	// and the client a query instead of an Exec; measured by
	// scripts/pg-dedup-cost.sh, BENCHMARKS.md).
	NewKeysByInsertNew() bool
	// DriverPrepares reports whether the driver keeps rmqtx's statements
	// prepared per connection by itself, so that database/sql prepared
	// statements (internal/stmtcache) would only add client work. MySQL:
	// false (go-sql-driver without interpolateParams prepares, executes and
	// closes every statement with arguments). PostgreSQL: true (pgx's
	// default exec mode caches a prepared statement per connection and
	// query text: one round trip per call; a user's other exec mode, such
	// as the simple protocol for a transaction-pooling PgBouncer, is then
	// respected rather than overridden).
	DriverPrepares() bool

	// LatestCommitted runs write, statements on db that must act on the
	// latest committed version of a row another transaction commits while
	// they wait on its lock (an insert that skips an existing key, an
	// update guarded by its WHERE clause), whatever isolation level the
	// session defaults to. MySQL runs write on db as it is: InnoDB's writes
	// read the latest committed version at every level. PostgreSQL runs it
	// in a READ COMMITTED transaction of its own (BEGIN carries the level,
	// COMMIT follows): at REPEATABLE READ or SERIALIZABLE such a statement
	// fails with a serialization failure (40001) instead of seeing the row.
	// The transaction costs a round trip or two, so owners keep it for the
	// rare writes that decide (fences), off their hot paths.
	LatestCommitted(ctx context.Context, db *sqlx.DB, write func(ctx context.Context, e sqlx.ExtContext) error) error
}

// ReturningExecer runs an UpsertReturning statement for ExecReturning: as a
// statement (MySQL) or as a query returning one row. *sqlx.DB, *sqlx.Tx and
// *sqlx.Conn satisfy it; an owner that keeps statements prepared wraps its
// cache in one.
type ReturningExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowxContext(ctx context.Context, query string, args ...any) *sqlx.Row
}

// ErrUnsupported is wrapped when a database handle's driver has no dialect.
var ErrUnsupported = errors.New("dialect: unsupported database driver")

// For returns the dialect of db, chosen by its driver name ("mysql", "pgx").
func For(db *sqlx.DB) (Dialect, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil database", ErrUnsupported)
	}
	return ForDriver(db.DriverName())
}

// ForDriver returns the dialect for a database/sql driver name: "mysql"
// (go-sql-driver/mysql) or "pgx" and "pgx/v5" (pgx's stdlib driver, the one
// PostgreSQL is tested with).
func ForDriver(driver string) (Dialect, error) {
	switch driver {
	case "mysql":
		return MySQL, nil
	case "pgx", "pgx/v5":
		return Postgres, nil
	}
	return nil, fmt.Errorf("%w: %q (rmqtx supports mysql and pgx)", ErrUnsupported, driver)
}

// Must is For for handles already validated by For (Config validation): it
// returns MySQL when db has no dialect, so callers need no second error
// path for a case validation has excluded.
func Must(db *sqlx.DB) Dialect {
	d, err := For(db)
	if err != nil {
		return MySQL
	}
	return d
}

// IsRetryable reports an error after which the whole transaction may run
// again: a deadlock, a serialization failure or a lock wait timeout.
func IsRetryable(d Dialect, err error) bool {
	return err != nil && (d.IsDeadlock(err) || d.IsLockTimeout(err))
}

// RolledBack reports an error after which a transaction is gone and may
// run again whole, on any database rmqtx supports: a deadlock, a
// serialization failure or a lock wait timeout. Callers that see an error
// without its database (txproducer.RetryAdvice) use it.
func RolledBack(err error) bool {
	for _, d := range All() {
		if IsRetryable(d, err) {
			return true
		}
	}
	return false
}

// BeginReadCommitted begins a READ COMMITTED transaction, the level every
// owner's short bookkeeping transaction (claim, fence, park) runs at.
func BeginReadCommitted(ctx context.Context, db *sqlx.DB) (*sqlx.Tx, error) {
	return db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
}

// All lists every dialect rmqtx supports, for classifiers that see an
// error without its database (txlog.IsDuplicateKey).
func All() []Dialect { return []Dialect{MySQL, Postgres} }
