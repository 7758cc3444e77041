package dialect

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	// The database/sql driver "pgx" this dialect is tested with.
	_ "github.com/jackc/pgx/v5/stdlib"
)

// Postgres is the dialect of PostgreSQL 15 or later, through pgx's
// database/sql driver (github.com/jackc/pgx/v5/stdlib, driver name "pgx").
//
// Timestamps are TIMESTAMPTZ(6): instants, as MySQL's DATETIME(6) columns
// hold them in UTC. Not TIMESTAMP without time zone: pgx binds a time.Time
// to that type by its wall clock in its own location, so a caller's
// non-UTC time would be stored shifted; to TIMESTAMPTZ it binds the
// instant, whatever the location or the session's TimeZone. Owners scan
// through sqltime, which hands back UTC on both databases. "Now" is
// statement_timestamp(): like MySQL's UTC_TIMESTAMP(6) it is the start of
// the current statement, one value for
// every row the statement touches; unlike now() it moves on between the
// statements of one transaction (a lease written late in a long transaction
// is measured from when it is written); and unlike clock_timestamp() it is
// stable within the statement, so "next_retry_at <= now" can bound an
// index scan and a multi-row insert stamps every row alike.
var Postgres Dialect = pgDialect{}

type pgDialect struct{}

// SQLSTATE codes (PostgreSQL, Appendix A).
const (
	pgUniqueViolation      = "23505"
	pgDeadlockDetected     = "40P01"
	pgSerializationFailure = "40001"
	pgLockNotAvailable     = "55P03"
	pgUndefinedTable       = "42P01"
	pgUndefinedObject      = "42704" // unrecognized configuration parameter
)

const pgNow = "statement_timestamp()"

func (pgDialect) Name() string               { return "postgres" }
func (pgDialect) Rebind(query string) string { return sqlx.Rebind(sqlx.DOLLAR, query) }
func (pgDialect) Now() string                { return pgNow }
func (pgDialect) NowPlusMicros() string {
	return pgNow + " + CAST(? AS BIGINT) * INTERVAL '1 microsecond'"
}
func (pgDialect) Excluded(column string) string   { return "EXCLUDED." + column }
func (pgDialect) SharedLock() string              { return "FOR SHARE" }
func (pgDialect) TimestampType() string           { return "TIMESTAMPTZ(6)" }
func (pgDialect) TableOptions() string            { return "" }
func (pgDialect) IsPrepareRefused(err error) bool { return false }

func (pgDialect) MicrosSince(expr string) string {
	return "CAST(EXTRACT(EPOCH FROM (" + pgNow + " - (" + expr + "))) * 1000000 AS BIGINT)"
}

func (pgDialect) InsertIgnore(table, columns, values, conflict string) string {
	return "INSERT INTO " + table + " (" + columns + ") VALUES " + wrapValues(values) + " ON CONFLICT" + conflictTarget(conflict) + " DO NOTHING"
}

// Upsert qualifies set's bare references to the table's columns with the
// table's name: inside ON CONFLICT DO UPDATE both the existing row and
// EXCLUDED are in scope, and PostgreSQL refuses a bare name as ambiguous.
func (pgDialect) Upsert(table, columns, values, conflict, set string) string {
	return "INSERT INTO " + table + " (" + columns + ") VALUES " + wrapValues(values) +
		" ON CONFLICT" + conflictTarget(conflict) + " DO UPDATE SET " + qualifySet(table, columns, set)
}

// UpsertReturning tells an insert from an update by the row's xmax: zero on
// a freshly inserted row, the updating transaction's id on a row the
// statement met (ON CONFLICT DO UPDATE locks the row first, and the lock is
// carried to the new row version).
func (d pgDialect) UpsertReturning(table, columns, values, conflict, set, returning string) string {
	return d.Upsert(table, columns, values, conflict, set) + " RETURNING (xmax = 0), " + returning
}

// RowsReturning appends the RETURNING clause.
func (pgDialect) RowsReturning(query, returning string) (string, bool) {
	return query + " RETURNING " + returning, true
}

// ExecReturning scans the row the RETURNING clause yields.
func (pgDialect) ExecReturning(ctx context.Context, e ReturningExecer, query string, args ...any) (bool, int64, error) {
	var inserted bool
	var v int64
	if err := e.QueryRowxContext(ctx, query, args...).Scan(&inserted, &v); err != nil {
		return false, 0, err
	}
	return inserted, v, nil
}

// DeleteLimit deletes through the primary key: PostgreSQL's DELETE has no
// ORDER BY or LIMIT. A composite key compares as a row value.
func (pgDialect) DeleteLimit(table, where, orderBy, key string) string {
	return "DELETE FROM " + table + " WHERE (" + key + ") IN (SELECT " + key + " FROM " + table +
		" WHERE " + where + " ORDER BY " + orderBy + " LIMIT ?)"
}

// CreateTableLike copies columns, defaults, identity (a sequence of its
// own), constraints and indexes.
func (pgDialect) CreateTableLike(dst, src string) string {
	return "CREATE TABLE IF NOT EXISTS " + dst + " (LIKE " + src + " INCLUDING ALL)"
}

// CopyReplacing deletes dst's rows that the copy replaces, then inserts the
// copy, in one statement that names where once (its placeholders bind
// once). The insert reads the delete's row count first, so the delete has
// run to completion before the first row goes in; the unique check does
// not count rows the same transaction deleted.
func (pgDialect) CopyReplacing(dst, src, where, key string) string {
	return "WITH copied AS MATERIALIZED (SELECT * FROM " + src + " WHERE " + where + "), " +
		"replaced AS (DELETE FROM " + dst + " WHERE (" + key + ") IN (SELECT " + key + " FROM copied) RETURNING 1) " +
		"INSERT INTO " + dst + " SELECT * FROM copied WHERE (SELECT COUNT(*) FROM replaced) >= 0"
}

// IsolationExprs: the level of the current transaction, or the session's
// default outside one ("read committed", "repeatable read", ...).
func (pgDialect) IsolationExprs() []string {
	return []string{"current_setting('transaction_isolation')"}
}

// ReadUncommitted reports "read uncommitted". PostgreSQL runs that level
// as READ COMMITTED (it never reads uncommitted rows), so an owner's
// answer would be safe either way; reporting it keeps the owners' logic the
// same on both databases, and costs only in that rare setting.
func (pgDialect) ReadUncommitted(level string) bool {
	return strings.EqualFold(strings.TrimSpace(level), "read uncommitted")
}

// TableExistsQuery looks in the current schema. Owners never quote table
// names, and PostgreSQL folds unquoted names to lower case.
func (pgDialect) TableExistsQuery() string {
	return "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = lower(?)"
}

// lockPoll is the pause between two tries of a taken lock.
const lockPoll = 100 * time.Millisecond

// Lock takes a session-level advisory lock on conn, keyed by a 64-bit hash
// of name. It is session-level, not transaction-level, because its holder
// (internal/migrate) runs several transactions under it. It polls the
// non-blocking pg_try_advisory_lock until wait has passed, so a wait that
// ends never races a lock being granted.
func (pgDialect) Lock(ctx context.Context, conn *sqlx.Conn, name string, wait time.Duration) (func(), error) {
	deadline := time.Now().Add(wait)
	for {
		var got bool
		if err := conn.GetContext(ctx, &got, "SELECT pg_try_advisory_lock(hashtextextended($1, 0))", name); err != nil {
			return nil, fmt.Errorf("dialect: lock %s: %w", name, err)
		}
		if got {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("dialect: could not take lock %s within %s", name, wait)
		}
		t := time.NewTimer(lockPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("dialect: lock %s: %w", name, ctx.Err())
		case <-t.C:
		}
	}
	return func() {
		// Release on a fresh context: the caller's may be done. A
		// connection that could not release goes back to no pool: the
		// lock ends with its session.
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var released bool
		if err := conn.GetContext(rctx, &released, "SELECT pg_advisory_unlock(hashtextextended($1, 0))", name); err != nil || !released {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}, nil
}

// InsertID appends a RETURNING clause: PostgreSQL has no last insert id.
func (pgDialect) InsertID(ctx context.Context, e sqlx.ExtContext, insert, idColumn string, args ...any) (int64, error) {
	var id int64
	if err := e.QueryRowxContext(ctx, insert+" RETURNING "+idColumn, args...).Scan(&id); err != nil {
		return 0, err
	}
	return id, nil
}

// sqlState returns err's SQLSTATE: pgx's *pgconn.PgError has the method.
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

func (pgDialect) IsDuplicateKey(err error) bool { return sqlState(err) == pgUniqueViolation }

// IsDeadlock reports a deadlock and a serialization failure (REPEATABLE
// READ or SERIALIZABLE): either way the transaction was rolled back, and
// running it again whole may succeed.
func (pgDialect) IsDeadlock(err error) bool {
	s := sqlState(err)
	return s == pgDeadlockDetected || s == pgSerializationFailure
}

func (pgDialect) IsLockTimeout(err error) bool     { return sqlState(err) == pgLockNotAvailable }
func (pgDialect) IsMissingTable(err error) bool    { return sqlState(err) == pgUndefinedTable }
func (pgDialect) IsUnknownVariable(err error) bool { return sqlState(err) == pgUndefinedObject }

// conflictTarget is " (conflict)", or "" for any unique key.
func conflictTarget(conflict string) string {
	if strings.TrimSpace(conflict) == "" {
		return ""
	}
	return " (" + conflict + ")"
}

// qualifySet prefixes with "table." every bare reference in set to one of
// columns, leaving alone each assignment's target (the name before "="
// at the top level), names after a ".", function names and string
// literals.
func qualifySet(table, columns, set string) string {
	cols := map[string]bool{}
	for _, c := range strings.Split(columns, ",") {
		cols[strings.ToLower(strings.TrimSpace(c))] = true
	}
	var b strings.Builder
	depth := 0
	target := true // the next identifier at depth 0 is an assignment's target
	prev := byte(0)
	for i := 0; i < len(set); {
		c := set[i]
		switch {
		case c == '\'':
			j := i + 1
			for j < len(set) {
				if set[j] == '\'' {
					if j+1 < len(set) && set[j+1] == '\'' {
						j += 2
						continue
					}
					break
				}
				j++
			}
			j = min(j+1, len(set))
			b.WriteString(set[i:j])
			i, prev = j, '\''
			continue
		case isIdentStart(c):
			j := i + 1
			for j < len(set) && isIdentPart(set[j]) {
				j++
			}
			word := set[i:j]
			k := j
			for k < len(set) && set[k] == ' ' {
				k++
			}
			call := k < len(set) && set[k] == '('
			switch {
			case depth == 0 && target:
				target = false
			case prev != '.' && !call && cols[strings.ToLower(word)]:
				b.WriteString(table + ".")
			}
			b.WriteString(word)
			i, prev = j, 'a'
			continue
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == ',' && depth == 0:
			target = true
		}
		b.WriteByte(c)
		if c != ' ' && c != '\n' && c != '\t' {
			prev = c
		}
		i++
	}
	return b.String()
}

func isIdentStart(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdentPart(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') || c == '$' }

// IdleTransactionLimit: SET LOCAL ends with the transaction, so there is
// nothing to reset (added with the outbox's held claims).
func (pgDialect) IdleTransactionLimit(limit time.Duration) (string, string) {
	return fmt.Sprintf("SET LOCAL idle_in_transaction_session_timeout = %d", max(limit.Milliseconds(), 1)), ""
}

// SHA256Hex: sha256() takes bytea (PostgreSQL 11 and later).
func (pgDialect) SHA256Hex(expr string) string {
	return "encode(sha256(" + expr + "), 'hex')"
}

// InsertNew skips a conflicting row instead of failing: on PostgreSQL a
// failed statement aborts the caller's whole transaction.
func (d pgDialect) InsertNew(table, columns, values, conflict string) string {
	return d.InsertIgnore(table, columns, values, conflict)
}

// NewKeysByInsertNew: DO NOTHING and an Exec cost less than DO UPDATE and
// RETURNING on a new key (see Dialect).
func (pgDialect) NewKeysByInsertNew() bool { return true }

func (pgDialect) DriverPrepares() bool { return true }

// ExecInsertNew reads zero affected rows as "not inserted".
func (pgDialect) ExecInsertNew(ctx context.Context, e sqlx.ExecerContext, query string, args ...any) (bool, error) {
	res, err := e.ExecContext(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// LatestCommitted runs write in a READ COMMITTED transaction: at
// REPEATABLE READ or SERIALIZABLE, an INSERT ... ON CONFLICT or an UPDATE
// that meets a row committed after the transaction's snapshot (by the
// transaction it waited for) fails with 40001; at READ COMMITTED it acts on
// that row.
func (pgDialect) LatestCommitted(ctx context.Context, db *sqlx.DB, write func(ctx context.Context, e sqlx.ExtContext) error) error {
	tx, err := BeginReadCommitted(ctx, db)
	if err != nil {
		return err
	}
	if err := write(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}
