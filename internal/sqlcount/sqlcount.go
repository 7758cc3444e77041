// Package sqlcount reads MariaDB/MySQL session counters (SHOW SESSION
// STATUS) to count the statements and round trips a piece of code costs.
// The bench tool reports them per transaction, and tests use them to check
// that rmqtx's statements are prepared once and executed in one round trip.
//
// Session counters belong to one connection: open the handle under test
// with SetMaxOpenConns(1) so every statement runs on the connection the
// counters are read from (Single does that).
package sqlcount

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jmoiron/sqlx"
)

// Counters are the status variables that count client commands.
type Counters struct {
	// Questions counts statements the client sent: COM_QUERY text
	// statements and COM_STMT_EXECUTE, not PREPARE or CLOSE.
	Questions int64
	Prepare   int64 // Com_stmt_prepare: one round trip each
	Execute   int64 // Com_stmt_execute (included in Questions)
	Close     int64 // Com_stmt_close: no reply, not a round trip
	Begin     int64 // Com_begin
	Commit    int64 // Com_commit
	Rollback  int64 // Com_rollback (a ROLLBACK TO SAVEPOINT is Com_rollback_to_savepoint)
	Savepoint int64 // Com_savepoint
	RollbackS int64 // Com_rollback_to_savepoint
	Insert    int64 // Com_insert
	Select    int64 // Com_select
	Update    int64 // Com_update
	Delete    int64 // Com_delete
	Set       int64 // Com_set_option (SET TRANSACTION ISOLATION LEVEL, ...)
}

var names = map[string]func(*Counters) *int64{
	"questions":                 func(c *Counters) *int64 { return &c.Questions },
	"com_stmt_prepare":          func(c *Counters) *int64 { return &c.Prepare },
	"com_stmt_execute":          func(c *Counters) *int64 { return &c.Execute },
	"com_stmt_close":            func(c *Counters) *int64 { return &c.Close },
	"com_begin":                 func(c *Counters) *int64 { return &c.Begin },
	"com_commit":                func(c *Counters) *int64 { return &c.Commit },
	"com_rollback":              func(c *Counters) *int64 { return &c.Rollback },
	"com_savepoint":             func(c *Counters) *int64 { return &c.Savepoint },
	"com_rollback_to_savepoint": func(c *Counters) *int64 { return &c.RollbackS },
	"com_insert":                func(c *Counters) *int64 { return &c.Insert },
	"com_select":                func(c *Counters) *int64 { return &c.Select },
	"com_update":                func(c *Counters) *int64 { return &c.Update },
	"com_delete":                func(c *Counters) *int64 { return &c.Delete },
	"com_set_option":            func(c *Counters) *int64 { return &c.Set },
}

// RoundTrips is the number of request/reply exchanges: every statement
// (Questions) plus every PREPARE. A CLOSE has no reply.
func (c Counters) RoundTrips() int64 { return c.Questions + c.Prepare }

// Sub returns c - o.
func (c Counters) Sub(o Counters) Counters {
	out := c
	for _, f := range names {
		*f(&out) -= *f(&o)
	}
	return out
}

// Div returns c / n per field, as floats, for per-operation figures.
func (c Counters) Div(n int64) map[string]float64 {
	out := map[string]float64{}
	if n <= 0 {
		return out
	}
	for k, f := range names {
		out[k] = float64(*f(&c)) / float64(n)
	}
	out["round_trips"] = float64(c.RoundTrips()) / float64(n)
	return out
}

// String is a compact one-line summary.
func (c Counters) String() string {
	return fmt.Sprintf("round trips %d (statements %d, prepares %d, executes %d, closes %d; begin %d commit %d rollback %d savepoint %d rollback-to %d; insert %d select %d update %d delete %d set %d)",
		c.RoundTrips(), c.Questions, c.Prepare, c.Execute, c.Close, c.Begin, c.Commit, c.Rollback, c.Savepoint, c.RollbackS,
		c.Insert, c.Select, c.Update, c.Delete, c.Set)
}

// Read returns db's session counters. db must have one connection (see the
// package doc); the SHOW itself is counted by the server, so use a Meter,
// which subtracts it.
func Read(ctx context.Context, db *sqlx.DB) (Counters, error) {
	rows, err := db.QueryContext(ctx, "SHOW SESSION STATUS WHERE Variable_name IN ("+
		"'Questions','Com_stmt_prepare','Com_stmt_execute','Com_stmt_close','Com_begin','Com_commit','Com_rollback',"+
		"'Com_savepoint','Com_rollback_to_savepoint','Com_insert','Com_select','Com_update','Com_delete','Com_set_option')")
	if err != nil {
		return Counters{}, fmt.Errorf("sqlcount: %w", err)
	}
	defer rows.Close()
	var c Counters
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return Counters{}, fmt.Errorf("sqlcount: %w", err)
		}
		if f, ok := names[strings.ToLower(k)]; ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			*f(&c) = n
		}
	}
	if err := rows.Err(); err != nil {
		return Counters{}, fmt.Errorf("sqlcount: %w", err)
	}
	return c, nil
}

// Meter measures the counters of code run on a one-connection handle.
type Meter struct {
	db   *sqlx.DB
	self Counters // what one Read adds to the counters
}

// NewMeter calibrates a meter on db (which must have one connection): it
// reads twice and remembers what a read itself adds.
func NewMeter(ctx context.Context, db *sqlx.DB) (*Meter, error) {
	a, err := Read(ctx, db)
	if err != nil {
		return nil, err
	}
	b, err := Read(ctx, db)
	if err != nil {
		return nil, err
	}
	return &Meter{db: db, self: b.Sub(a)}, nil
}

// Measure runs f and returns the counters it added.
func (m *Meter) Measure(ctx context.Context, f func() error) (Counters, error) {
	a, err := Read(ctx, m.db)
	if err != nil {
		return Counters{}, err
	}
	if err := f(); err != nil {
		return Counters{}, err
	}
	b, err := Read(ctx, m.db)
	if err != nil {
		return Counters{}, err
	}
	return b.Sub(a).Sub(m.self), nil
}

// Single opens a second handle on db's database and DSN with exactly one
// connection, for counting. dsn is the DSN db was opened with.
func Single(dsn string) (*sqlx.DB, error) {
	db, err := sqlx.Open("mysql", dsn)
	if err != nil {
		return nil, fmt.Errorf("sqlcount: %w", err)
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	return db, nil
}
