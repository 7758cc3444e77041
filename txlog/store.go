package txlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqltime"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
)

// Store reads and writes the transaction log table. It is safe for
// concurrent use. Every method takes a context; callers on the check-back
// path must give it a deadline.
type Store struct {
	db    *sqlx.DB
	d     dialect.Dialect
	table string
	q     queries
	now   func() time.Time
	// stmts keeps the statements prepared: one round trip each whatever
	// the DSN (package stmtcache), the insert included, which runs on the
	// caller's transaction.
	stmts *stmtcache.Cache
	// getVar is the index in the dialect's IsolationExprs of the one
	// getOne reads; len(getOne) once none is known (Get then always reads
	// in a READ COMMITTED transaction).
	getVar atomic.Int32
}

type queries struct {
	insert, insertIgnore, get, markRecovered, deleteBatch string
	getOne                                                []string
}

const columns = "event_id, producer_group, topic, tags, msg_keys, event_type, state, payload, payload_hash, " +
	"properties, business_key, created_at, resolved_at, resolved_by, recovered_at, recovery_decision, recovery_note"

// New returns a Store for the table prefix+"txlog" in db. An empty prefix
// means DefaultPrefix (rmqtx_txlog), as everywhere in rmqtx; the prefix is
// validated (letters, digits and underscores, starting with a letter).
func New(db *sqlx.DB, prefix string) (*Store, error) {
	if db == nil {
		return nil, invalid("nil database")
	}
	d, err := dialect.For(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	table, err := TableName(prefix)
	if err != nil {
		return nil, err
	}
	s := &Store{db: db, d: d, table: table, now: func() time.Time { return time.Now().UTC() }}
	values := "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?"
	s.q = queries{
		insert:        d.Rebind("INSERT INTO " + table + " (" + columns + ") VALUES (" + values + ")"),
		insertIgnore:  d.Rebind(d.InsertIgnore(table, columns, values, "event_id")),
		get:           d.Rebind("SELECT " + columns + " FROM " + table + " WHERE event_id = ?"),
		markRecovered: d.Rebind("UPDATE " + table + " SET recovered_at = ?, recovery_decision = ?, recovery_note = ? WHERE event_id = ?"),
		deleteBatch:   d.Rebind(d.DeleteLimit(table, "state = ? AND resolved_at < ?", "resolved_at", "event_id")),
	}
	tcols := "t." + strings.ReplaceAll(columns, ", ", ", t.")
	for _, v := range d.IsolationExprs() {
		// One row whether or not the event has one: the session's
		// isolation level, joined with the row (NULLs when missing).
		s.q.getOne = append(s.q.getOne, d.Rebind("SELECT i.iso, "+tcols+" FROM (SELECT "+v+" AS iso) i LEFT JOIN "+table+
			" t ON t.event_id = ?"))
	}
	s.stmts = stmtcache.New(db)
	stmtcache.CloseWith(s, s.stmts)
	return s, nil
}

// Table returns the table name, prefix included.
func (s *Store) Table() string { return s.table }

// DB returns the database the store writes to.
func (s *Store) DB() *sqlx.DB { return s.db }

type dbRow struct {
	EventID          string           `db:"event_id"`
	ProducerGroup    string           `db:"producer_group"`
	Topic            string           `db:"topic"`
	Tags             string           `db:"tags"`
	Keys             string           `db:"msg_keys"`
	EventType        string           `db:"event_type"`
	State            string           `db:"state"`
	Payload          []byte           `db:"payload"`
	PayloadHash      string           `db:"payload_hash"`
	Properties       sql.NullString   `db:"properties"`
	BusinessKey      string           `db:"business_key"`
	CreatedAt        sqltime.Time     `db:"created_at"`
	ResolvedAt       sqltime.Time     `db:"resolved_at"`
	ResolvedBy       string           `db:"resolved_by"`
	RecoveredAt      sqltime.NullTime `db:"recovered_at"`
	RecoveryDecision sql.NullString   `db:"recovery_decision"`
	RecoveryNote     sql.NullString   `db:"recovery_note"`
}

func (r dbRow) row() Row {
	return Row{
		EventID: r.EventID, ProducerGroup: r.ProducerGroup, Topic: r.Topic, Tags: r.Tags, Keys: r.Keys,
		EventType: r.EventType, State: State(r.State), Payload: r.Payload, PayloadHash: r.PayloadHash,
		Properties: r.Properties.String, BusinessKey: r.BusinessKey,
		CreatedAt: r.CreatedAt.Time, ResolvedAt: r.ResolvedAt.Time, ResolvedBy: ResolvedBy(r.ResolvedBy),
		RecoveredAt: r.RecoveredAt.Time, RecoveryDecision: RecoveryDecision(r.RecoveryDecision.String),
		RecoveryNote: r.RecoveryNote.String,
	}
}

// getRow is what getOne reads: the session's isolation level and the row,
// all NULL when there is none.
type getRow struct {
	Iso              string           `db:"iso"`
	EventID          sql.NullString   `db:"event_id"`
	ProducerGroup    sql.NullString   `db:"producer_group"`
	Topic            sql.NullString   `db:"topic"`
	Tags             sql.NullString   `db:"tags"`
	Keys             sql.NullString   `db:"msg_keys"`
	EventType        sql.NullString   `db:"event_type"`
	State            sql.NullString   `db:"state"`
	Payload          []byte           `db:"payload"`
	PayloadHash      sql.NullString   `db:"payload_hash"`
	Properties       sql.NullString   `db:"properties"`
	BusinessKey      sql.NullString   `db:"business_key"`
	CreatedAt        sqltime.NullTime `db:"created_at"`
	ResolvedAt       sqltime.NullTime `db:"resolved_at"`
	ResolvedBy       sql.NullString   `db:"resolved_by"`
	RecoveredAt      sqltime.NullTime `db:"recovered_at"`
	RecoveryDecision sql.NullString   `db:"recovery_decision"`
	RecoveryNote     sql.NullString   `db:"recovery_note"`
}

func (g getRow) row() Row {
	return dbRow{
		EventID: g.EventID.String, ProducerGroup: g.ProducerGroup.String, Topic: g.Topic.String, Tags: g.Tags.String,
		Keys: g.Keys.String, EventType: g.EventType.String, State: g.State.String, Payload: g.Payload,
		PayloadHash: g.PayloadHash.String, Properties: g.Properties, BusinessKey: g.BusinessKey.String,
		CreatedAt: sqltime.Time{Time: g.CreatedAt.Time}, ResolvedAt: sqltime.Time{Time: g.ResolvedAt.Time},
		ResolvedBy: g.ResolvedBy.String, RecoveredAt: g.RecoveredAt, RecoveryDecision: g.RecoveryDecision,
		RecoveryNote: g.RecoveryNote,
	}.row()
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func (s *Store) args(r *Row) ([]any, error) {
	if r.EventID == "" || len(r.EventID) > 64 {
		return nil, invalid("event id must be 1 to 64 bytes, got %d", len(r.EventID))
	}
	if !r.State.Valid() {
		return nil, invalid("state %q", r.State)
	}
	if r.ResolvedBy == "" {
		return nil, invalid("resolved_by is required")
	}
	now := s.now()
	if r.CreatedAt.IsZero() {
		r.CreatedAt = now
	}
	if r.ResolvedAt.IsZero() {
		r.ResolvedAt = now
	}
	var recoveredAt any
	if !r.RecoveredAt.IsZero() {
		recoveredAt = r.RecoveredAt.UTC()
	}
	return []any{
		r.EventID, r.ProducerGroup, r.Topic, r.Tags, r.Keys, r.EventType, string(r.State), r.Payload, r.PayloadHash,
		nullable(r.Properties), r.BusinessKey, r.CreatedAt.UTC(), r.ResolvedAt.UTC(), string(r.ResolvedBy),
		recoveredAt, nullable(string(r.RecoveryDecision)), nullable(r.RecoveryNote),
	}, nil
}

// IsDuplicateKey reports whether err is the database's duplicate-key
// error (a unique key already holds the value), on any database rmqtx
// supports.
func IsDuplicateKey(err error) bool {
	for _, d := range dialect.All() {
		if d.IsDuplicateKey(err) {
			return true
		}
	}
	return false
}

// Insert writes r inside the caller's transaction. The producer calls it as
// the FIRST statement of the local transaction, so the row (and its
// primary-key lock) exists for the whole transaction and becomes visible
// exactly at commit. A row that already exists gives an error wrapping
// ErrDuplicate; roll the transaction back (PostgreSQL has already aborted it).
func (s *Store) Insert(ctx context.Context, tx sqlx.ExecerContext, r Row) error {
	a, err := s.args(&r)
	if err != nil {
		return err
	}
	if _, err := s.stmts.ExecOn(ctx, tx, s.q.insert, a...); err != nil {
		if IsDuplicateKey(err) {
			return fmt.Errorf("%w: %s: %w", ErrDuplicate, r.EventID, err)
		}
		return fmt.Errorf("txlog: insert %s: %w", r.EventID, err)
	}
	return nil
}

// readCommitted is how Get reads when getOne cannot: a read-only READ
// COMMITTED transaction.
// A plain autocommit SELECT inherits the session's isolation, and under
// READ UNCOMMITTED (a server or DSN default we do not control) it would see
// the COMMITTED row of a local transaction that is still running and may
// yet roll back: a check would answer COMMIT for a ghost (I2). The
// transaction costs two extra round trips but stays a non-locking point
// lookup, so it never waits on a running local transaction.
var readCommitted = &sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true}

// Get returns the row for id, or an error wrapping ErrNotFound. It reads
// committed data only, whatever the server's or the session's default
// isolation, so an in-flight local transaction's row is never seen.
//
// It costs one statement (getOne): an autocommit point read that also
// returns the session's isolation level. At READ COMMITTED, REPEATABLE
// READ and SERIALIZABLE such a read is a non-locking read of committed
// data; only at READ UNCOMMITTED is its answer not trusted, and Get reads
// again in a READ COMMITTED transaction (four round trips).
func (s *Store) Get(ctx context.Context, id string) (Row, error) {
	if i := s.getVar.Load(); int(i) < len(s.q.getOne) {
		var g getRow
		err := s.stmts.Get(ctx, &g, s.q.getOne[i], id)
		switch {
		case s.d.IsUnknownVariable(err):
			s.getVar.CompareAndSwap(i, i+1)
			return s.Get(ctx, id)
		case err != nil:
			return Row{}, fmt.Errorf("txlog: get %s: %w", id, err)
		case !s.d.ReadUncommitted(g.Iso):
			if !g.EventID.Valid {
				return Row{}, fmt.Errorf("%w: %s", ErrNotFound, id)
			}
			return g.row(), nil
		}
	}
	return s.getTx(ctx, id)
}

// getTx is Get in a read-only READ COMMITTED transaction.
func (s *Store) getTx(ctx context.Context, id string) (Row, error) {
	tx, err := s.db.BeginTxx(ctx, readCommitted)
	if err != nil {
		return Row{}, fmt.Errorf("txlog: get %s: begin: %w", id, err)
	}
	defer func() { _ = tx.Rollback() }() // read-only: nothing to commit
	var r dbRow
	if err := s.stmts.TxGet(ctx, tx, &r, s.q.get, id); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return Row{}, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		return Row{}, fmt.Errorf("txlog: get %s: %w", id, err)
	}
	return r.row(), nil
}

// Record writes r unless a row with its event id exists (an insert that
// ignores the duplicate key, on its own: one statement, in a READ COMMITTED
// transaction where the database needs one, see
// dialect.LatestCommitted), then reads the row back and returns it:
// the returned row, not r, is the decision. inserted reports whether r was
// written. If a local transaction that inserted the same id is still
// running, the INSERT waits on its row lock, so the answer is the local
// outcome: COMMITTED if it commits, r if it rolls back.
func (s *Store) Record(ctx context.Context, r Row) (row Row, inserted bool, err error) {
	a, err := s.args(&r)
	if err != nil {
		return Row{}, false, err
	}
	// The insert must meet the row of a local transaction that commits while
	// it waits (LatestCommitted: PostgreSQL's REPEATABLE READ or
	// SERIALIZABLE session default would fail it with a serialization
	// failure, leaving the check undecided).
	var res sql.Result
	err = s.d.LatestCommitted(ctx, s.db, func(ctx context.Context, e sqlx.ExtContext) error {
		var err error
		if tx, ok := e.(*sqlx.Tx); ok {
			res, err = s.stmts.TxExec(ctx, tx, s.q.insertIgnore, a...)
		} else {
			res, err = s.stmts.Exec(ctx, s.q.insertIgnore, a...)
		}
		return err
	})
	if err != nil {
		return Row{}, false, fmt.Errorf("txlog: record %s: %w", r.EventID, err)
	}
	n, _ := res.RowsAffected()
	row, err = s.Get(ctx, r.EventID)
	if err != nil {
		return Row{}, false, err
	}
	return row, n == 1, nil
}

// Fence makes sure a decision exists for r.EventID: it records r as
// ROLLED_BACK (ResolvedBy defaults to ByFence) unless a row exists, and
// returns the row as it stands afterwards. See Record for how it waits on a
// local transaction still in flight.
//
// When r names a half (Row.Half) and the row that exists is ROLLED_BACK
// for another half (Retakable), Fence also makes sure r's half can never
// retake the id: it raises the row's resolved_at to now (see Retake),
// after waiting for a Retake in flight, and returns the row as that left
// it. fenced stays false then: it reports that a row was written for a
// transaction that had none.
func (s *Store) Fence(ctx context.Context, r Row) (row Row, fenced bool, err error) {
	r.State = StateRolledBack
	r.Payload = nil
	if r.ResolvedBy == "" {
		r.ResolvedBy = ByFence
	}
	row, fenced, err = s.Record(ctx, r)
	if err != nil || fenced || !Retakable(row, r.Half()) {
		return row, fenced, err
	}
	row, err = s.fenceHalf(ctx, r.EventID)
	return row, false, err
}

// MarkRecovered records what discard recovery decided for id.
func (s *Store) MarkRecovered(ctx context.Context, id string, d RecoveryDecision, note string) error {
	if len(note) > 255 {
		note = note[:255]
	}
	res, err := s.stmts.Exec(ctx, s.q.markRecovered, s.now(), string(d), nullable(note), id)
	if err != nil {
		return fmt.Errorf("txlog: mark recovered %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		// Some databases report 0 for an unchanged row too; tell them apart.
		if _, err := s.Get(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// Filter selects rows for List and Count. Zero fields do not filter.
type Filter struct {
	Group            string           // producer group
	State            State            // COMMITTED or ROLLED_BACK
	ResolvedBy       ResolvedBy       // what decided the row
	RecoveryDecision RecoveryDecision // only rows recovery handled this way
	Recovered        *bool            // true: recovered rows only; false: never recovered
	CreatedBefore    time.Time        // "old" rows
	CreatedAfter     time.Time
	// After continues a listing after this row (keyset pagination on
	// created_at, event_id): pass the last row of the previous page.
	After *Row
	// Limit caps a List page: default 100, at most 1000.
	Limit int
	// WithPayload includes the payload in listed rows (off by default so
	// listings stay small and nothing sensitive is read needlessly).
	WithPayload bool
}

func (f Filter) where() (string, []any) {
	var conds []string
	var args []any
	add := func(c string, a ...any) { conds = append(conds, c); args = append(args, a...) }
	if f.Group != "" {
		add("producer_group = ?", f.Group)
	}
	if f.State != "" {
		add("state = ?", string(f.State))
	}
	if f.ResolvedBy != "" {
		add("resolved_by = ?", string(f.ResolvedBy))
	}
	if f.RecoveryDecision != "" {
		add("recovery_decision = ?", string(f.RecoveryDecision))
	}
	if f.Recovered != nil {
		if *f.Recovered {
			add("recovered_at IS NOT NULL")
		} else {
			add("recovered_at IS NULL")
		}
	}
	if !f.CreatedBefore.IsZero() {
		add("created_at < ?", f.CreatedBefore.UTC())
	}
	if !f.CreatedAfter.IsZero() {
		add("created_at > ?", f.CreatedAfter.UTC())
	}
	if f.After != nil {
		add("(created_at > ? OR (created_at = ? AND event_id > ?))", f.After.CreatedAt.UTC(), f.After.CreatedAt.UTC(), f.After.EventID)
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// List returns rows matching f, oldest first (created_at, event_id). In
// this log every row is decided; "stuck" transactions are the ones with no
// row, visible on the broker side. Useful listings are old rows
// (CreatedBefore), fenced rows (ResolvedBy: ByFence) and recovery outcomes.
func (s *Store) List(ctx context.Context, f Filter) ([]Row, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	if limit > 1000 {
		limit = 1000
	}
	cols := columns
	if !f.WithPayload {
		cols = strings.Replace(columns, "payload,", "NULL AS payload,", 1)
	}
	where, args := f.where()
	q := "SELECT " + cols + " FROM " + s.table + where + " ORDER BY created_at, event_id LIMIT ?"
	var rs []dbRow
	if err := s.db.SelectContext(ctx, &rs, s.d.Rebind(q), append(args, limit)...); err != nil {
		return nil, fmt.Errorf("txlog: list: %w", err)
	}
	out := make([]Row, len(rs))
	for i, r := range rs {
		out[i] = r.row()
	}
	return out, nil
}

// Count returns the number of rows matching f (After and Limit ignored).
func (s *Store) Count(ctx context.Context, f Filter) (int, error) {
	f.After = nil
	where, args := f.where()
	var n int
	if err := s.db.GetContext(ctx, &n, s.d.Rebind("SELECT COUNT(*) FROM "+s.table+where), args...); err != nil {
		return 0, fmt.Errorf("txlog: count: %w", err)
	}
	return n, nil
}

// DeleteTerminalBefore deletes rows resolved before cutoff, in batches of
// batch rows (default 500), each batch its own short statement, so a large
// cleanup never holds long locks. cutoff must be at least MinRetention in
// the past (ErrRetentionTooShort). Every row in this log is terminal; the
// state predicate keeps it that way should a non-terminal state appear. It
// returns the number of rows deleted, which may be partial on error.
func (s *Store) DeleteTerminalBefore(ctx context.Context, cutoff time.Time, batch int) (int64, error) {
	if cutoff.After(s.now().Add(-MinRetention)) {
		return 0, fmt.Errorf("%w: cutoff %s is less than %s ago", ErrRetentionTooShort, cutoff.UTC().Format(time.RFC3339), MinRetention)
	}
	if batch <= 0 {
		batch = 500
	}
	var total int64
	for _, st := range []State{StateCommitted, StateRolledBack} {
		for {
			if err := ctx.Err(); err != nil {
				return total, fmt.Errorf("txlog: delete: %w", err)
			}
			res, err := s.stmts.Exec(ctx, s.q.deleteBatch, string(st), cutoff.UTC(), batch)
			if err != nil {
				return total, fmt.Errorf("txlog: delete: %w", err)
			}
			n, _ := res.RowsAffected()
			total += n
			if n < int64(batch) {
				break
			}
		}
	}
	return total, nil
}
