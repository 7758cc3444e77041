// Package stmtcache keeps rmqtx's own SQL statements prepared, so that each
// costs one round trip whatever the user's DSN says.
//
// With go-sql-driver's default DSN (no interpolateParams), every statement
// with arguments run through database/sql is a PREPARE, an EXECUTE and a
// CLOSE: two round trips (the CLOSE has no reply) and a parse per call. A
// *sql.Stmt prepared on the *sql.DB is instead prepared once per pooled
// connection and reused by database/sql, also inside a transaction on that
// connection (Tx.StmtContext finds the connection's prepared statement): one
// COM_STMT_EXECUTE per call, values bound by the server. This works with any
// DSN and on the caller's own transactions, which a second handle opened
// with interpolateParams=true could not reach (and rmqtx only gets a *sql.DB,
// not a DSN).
//
// On a driver that keeps statements prepared by itself
// (dialect.Dialect.DriverPrepares: pgx) the cache prepares nothing and runs
// every statement as given: the driver's own cache already makes each one
// round trip, and a database/sql prepared statement on top only costs
// client CPU per call (a Stmt per transaction and its bookkeeping).
//
// Every statement text is rmqtx's own (validated table names, placeholders
// for every value); the cache is keyed by that text. When the server refuses
// to prepare (max_prepared_stmt_count reached, or a statement the prepared
// protocol does not support), the statement runs unprepared as before, and
// preparing is tried again a minute later. A nil *Cache runs statements on
// a transaction unprepared (TxExec, TxGet, TxSelect, ExecOn); Exec, Get and
// Select need a cache, which knows the database.
package stmtcache

import (
	"context"
	"database/sql"
	"runtime"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// retryPrepare is how long a statement the server refused to prepare runs
// unprepared before preparing it is tried again.
const retryPrepare = time.Minute

// errOtherDB is database/sql's text for a statement used on a transaction of
// another *sql.DB: such a transaction runs the statement unprepared.
const errOtherDB = "sql: Tx.Stmt: statement from different database used"

// Cache holds prepared statements of one *sql.DB. It is safe for concurrent
// use.
type Cache struct {
	db     *sqlx.DB
	mu     sync.Mutex
	m      map[string]*sqlx.Stmt
	refuse map[string]time.Time // statements the server would not prepare, and since when
	busy   map[string]bool      // statements being prepared in the background
	closed bool
	direct bool // the driver prepares by itself: run every statement as given
}

// New returns a cache for db (nil db: a nil cache, which prepares nothing).
func New(db *sqlx.DB) *Cache {
	if db == nil {
		return nil
	}
	d, err := dialect.For(db)
	return &Cache{db: db, m: map[string]*sqlx.Stmt{}, refuse: map[string]time.Time{}, busy: map[string]bool{},
		direct: err == nil && d.DriverPrepares()}
}

// CloseWith closes c when owner becomes unreachable, for owners with no
// Close of their own: a *sql.Stmt stays registered with its *sql.DB, and
// prepared on the server, until it is closed.
func CloseWith[T any](owner *T, c *Cache) {
	if c == nil || owner == nil {
		return
	}
	runtime.AddCleanup(owner, func(c *Cache) { go c.Close() }, c)
}

// Close closes every prepared statement; later calls run unprepared.
// Idempotent.
func (c *Cache) Close() {
	if c == nil {
		return
	}
	c.mu.Lock()
	stmts := c.m
	c.m, c.closed = nil, true
	c.mu.Unlock()
	for _, st := range stmts {
		_ = st.Close()
	}
}

// Len returns how many statements are prepared.
func (c *Cache) Len() int {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// DB returns the database the cache prepares on.
func (c *Cache) DB() *sqlx.DB { return c.db }

// stmt returns the prepared statement for query, preparing it on first use,
// or nil when it runs unprepared (nil cache, closed, refused, or preparing
// failed: the unprepared call then reports the statement's real error).
func (c *Cache) stmt(ctx context.Context, query string) *sqlx.Stmt {
	st, ok := c.lookup(query)
	if !ok {
		return st
	}
	// Outside the lock, so a slow or unreachable database delays only the
	// callers that need this statement now, each within its own ctx. Two
	// first uses may both prepare; one statement is kept.
	st, err := c.db.PreparexContext(ctx, query)
	return c.store(query, st, err)
}

// txStmt is stmt for a statement about to run inside a transaction. The
// first use does not prepare on the database then: that needs a second
// connection of the pool while the transaction holds one, and with every
// connection held by such transactions it would wait forever. It runs
// unprepared instead and prepares in the background, once a connection is
// free; later uses find the statement (database/sql then prepares it on the
// transaction's own connection, if that one lacks it).
func (c *Cache) txStmt(query string) *sqlx.Stmt {
	st, ok := c.lookup(query)
	if !ok {
		return st
	}
	c.mu.Lock()
	if c.busy[query] {
		c.mu.Unlock()
		return nil
	}
	c.busy[query] = true
	c.mu.Unlock()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		st, err := c.db.PreparexContext(ctx, query)
		c.store(query, st, err)
		c.mu.Lock()
		delete(c.busy, query)
		c.mu.Unlock()
	}()
	return nil
}

// lookup returns the cached statement (and false), nil and false when the
// statement runs unprepared now, or nil and true when it should be prepared.
func (c *Cache) lookup(query string) (*sqlx.Stmt, bool) {
	if c == nil || c.direct {
		return nil, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, false
	}
	if st := c.m[query]; st != nil {
		return st, false
	}
	if since, ok := c.refuse[query]; ok {
		if time.Since(since) < retryPrepare {
			return nil, false
		}
		delete(c.refuse, query)
	}
	return nil, true
}

// store keeps a freshly prepared statement (or notes a refusal) and returns
// the statement to use.
func (c *Cache) store(query string, st *sqlx.Stmt, err error) *sqlx.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if refused(err) {
			c.refuse[query] = time.Now()
		}
		return nil
	}
	if c.closed {
		_ = st.Close()
		return nil
	}
	if old := c.m[query]; old != nil {
		_ = st.Close()
		return old
	}
	c.m[query] = st
	return st
}

// refused reports an error that makes a statement run unprepared instead:
// the server's "cannot prepare this here" (dialect.IsPrepareRefused), not
// "the statement is wrong".
func refused(err error) bool {
	for _, d := range dialect.All() {
		if d.IsPrepareRefused(err) {
			return true
		}
	}
	return err.Error() == errOtherDB
}

// Exec runs query on the cache's database.
func (c *Cache) Exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if st := c.stmt(ctx, query); st != nil {
		res, err := st.ExecContext(ctx, args...)
		if err == nil || !refused(err) {
			return res, err
		}
	}
	return c.db.ExecContext(ctx, query, args...)
}

// Get runs query on the cache's database and scans its one row into dest
// (sql.ErrNoRows when there is none).
func (c *Cache) Get(ctx context.Context, dest any, query string, args ...any) error {
	if st := c.stmt(ctx, query); st != nil {
		err := st.GetContext(ctx, dest, args...)
		if err == nil || !refused(err) {
			return err
		}
	}
	return c.db.GetContext(ctx, dest, query, args...)
}

// Select runs query on the cache's database and scans every row into dest.
func (c *Cache) Select(ctx context.Context, dest any, query string, args ...any) error {
	if st := c.stmt(ctx, query); st != nil {
		err := st.SelectContext(ctx, dest, args...)
		if err == nil || !refused(err) {
			return err
		}
	}
	return c.db.SelectContext(ctx, dest, query, args...)
}

// TxExec runs query inside tx, with the statement prepared on tx's
// connection. tx may belong to another *sql.DB; it then runs unprepared.
func (c *Cache) TxExec(ctx context.Context, tx *sqlx.Tx, query string, args ...any) (sql.Result, error) {
	if st := c.txStmt(query); st != nil {
		ts := tx.StmtxContext(ctx, st)
		res, err := ts.ExecContext(ctx, args...)
		_ = ts.Close() // the connection keeps the statement prepared (its parent owns it)
		if err == nil || !refused(err) {
			return res, err
		}
	}
	return tx.ExecContext(ctx, query, args...)
}

// TxGet is Get inside tx.
func (c *Cache) TxGet(ctx context.Context, tx *sqlx.Tx, dest any, query string, args ...any) error {
	if st := c.txStmt(query); st != nil {
		ts := tx.StmtxContext(ctx, st)
		err := ts.GetContext(ctx, dest, args...)
		_ = ts.Close()
		if err == nil || !refused(err) {
			return err
		}
	}
	return tx.GetContext(ctx, dest, query, args...)
}

// TxSelect is Select inside tx.
func (c *Cache) TxSelect(ctx context.Context, tx *sqlx.Tx, dest any, query string, args ...any) error {
	if st := c.txStmt(query); st != nil {
		ts := tx.StmtxContext(ctx, st)
		err := ts.SelectContext(ctx, dest, args...)
		_ = ts.Close()
		if err == nil || !refused(err) {
			return err
		}
	}
	return tx.SelectContext(ctx, dest, query, args...)
}

// Execer is what a caller's transaction may be: a *sqlx.Tx or *sql.Tx run
// the statement prepared; anything else (a *sql.Conn, a wrapper) runs it as
// given.
type Execer = sqlx.ExecerContext

// ExecOn runs query on ex: prepared when ex is a transaction (*sqlx.Tx or
// *sql.Tx), as given otherwise.
func (c *Cache) ExecOn(ctx context.Context, ex Execer, query string, args ...any) (sql.Result, error) {
	switch tx := ex.(type) {
	case *sqlx.Tx:
		return c.TxExec(ctx, tx, query, args...)
	case *sql.Tx:
		if c != nil {
			return c.TxExec(ctx, &sqlx.Tx{Tx: tx, Mapper: c.db.Mapper}, query, args...)
		}
	}
	return ex.ExecContext(ctx, query, args...)
}
