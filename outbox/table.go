package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/internal/sqltime"
	"github.com/rmqtx/rmqtx/wire"
)

// DefaultPrefix is the table prefix used when none is configured: the one
// rmqtx default (internal/sqlname), shared by every package.
const DefaultPrefix = sqlname.DefaultPrefix

// TableSuffix: the outbox lives in <prefix>outbox.
const TableSuffix = "outbox"

// Execer is what Enqueue needs from the caller's transaction: *sqlx.Tx and
// *sql.Tx both satisfy it. Pass the transaction that holds the business
// change; passing a *sql.DB works but loses the atomicity the outbox is for.
//
// The SQL is written for the database the handle names with a DriverName
// method (*sqlx.Tx and *sqlx.DB do). A handle without one (*sql.Tx,
// *sql.DB) says nothing of its database, and a guess would send one
// database's SQL to the other: it needs a table bound to its driver with
// Table.WithDriver, and is an ErrConfig otherwise.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// driverNamer is a handle that names its database/sql driver.
type driverNamer interface{ DriverName() string }

// dialectOf returns the dialect of a caller's handle (see Execer): Table's
// methods run on the caller's transaction or pool, so the table cannot
// choose its dialect once, as a Dispatcher does. A handle that names its
// driver is taken at its word; one that does not takes the table's
// (WithDriver). An unsupported or unknown driver is a configuration error.
func (t Table) dialectOf(h any) (dialect.Dialect, error) {
	n, ok := h.(driverNamer)
	if !ok {
		if t.d == nil {
			return nil, fmt.Errorf("%w: a %T does not name its database driver: pass a *sqlx.Tx or *sqlx.DB, "+
				"or bind the table to the driver with Table.WithDriver", ErrConfig, h)
		}
		return t.d, nil
	}
	d, err := dialect.ForDriver(n.DriverName())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return d, nil
}

// Table is the outbox table under one prefix. It is a cheap value with no
// connection of its own; the zero value is not usable, use NewTable.
type Table struct {
	name string          // prefix + "outbox"
	d    dialect.Dialect // WithDriver's: for handles that name no driver
}

// NewTable returns the outbox table <prefix>outbox. An empty prefix means
// DefaultPrefix. The prefix is validated with internal/sqlname.
func NewTable(prefix string) (Table, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	name, err := sqlname.Table(prefix, TableSuffix)
	if err != nil {
		return Table{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return Table{name: name}, nil
}

// WithDriver returns t bound to the database of the database/sql driver
// named driver ("mysql", "pgx"), so that its methods also take handles
// that do not name their driver (*sql.Tx, *sql.DB); a handle that does is
// still taken at its word. An unsupported driver is an ErrConfig.
func (t Table) WithDriver(driver string) (Table, error) {
	d, err := dialect.ForDriver(driver)
	if err != nil {
		return Table{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	t.d = d
	return t, nil
}

// Name returns the table name, for example "rmqtx_outbox".
func (t Table) Name() string { return t.name }

// Enqueue writes e as a PENDING row inside the caller's transaction tx and
// returns its event id (generated when e.EventID is empty). The row becomes
// visible to dispatchers when tx commits; call Dispatcher.Notify after the
// commit to send it at once instead of at the next poll.
//
// An event id that already has a row is an error wrapping
// ErrDuplicateEvent, and tx stays usable on every database: nothing was
// written, and the caller may still commit its other work (PostgreSQL
// would abort the whole transaction on a failed INSERT, so the statement
// skips the existing row there instead of failing).
//
// When ctx holds a span (the caller's, an HTTP request's for example), its
// trace context is stored with the row, in the headers column under keys
// that no header name can have (they start with a NUL), and the message
// carries it on (Config.TracerProvider); no tracer is needed for that.
func (t Table) Enqueue(ctx context.Context, tx Execer, e Event) (string, error) {
	if tx == nil {
		return "", fmt.Errorf("%w: nil transaction", ErrInvalidEvent)
	}
	if e.EventID == "" {
		e.EventID = wire.NewEventID()
	}
	if err := e.Validate(); err != nil {
		return "", err
	}
	d, err := t.dialectOf(tx)
	if err != nil {
		return "", err
	}
	var headers sql.NullString
	if h := otelx.RowHeaders(ctx, e.Headers); len(h) > 0 { // with ctx's trace context, if any
		b, err := json.Marshal(h)
		if err != nil {
			return "", fmt.Errorf("%w: headers: %w", ErrInvalidEvent, err)
		}
		headers = sql.NullString{String: string(b), Valid: true}
	}
	payload := e.Payload
	if payload == nil {
		payload = []byte{}
	}
	now := d.Now()
	inserted, err := d.ExecInsertNew(ctx, tx, d.Rebind(d.InsertNew(t.name, `event_id, aggregate_type, aggregate_id, aggregate_version,
  event_type, event_version, destination, message_key, payload, headers, status, retry_count,
  next_retry_at, created_at, updated_at`, `?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', 0, `+now+`, `+now+`, `+now, "event_id")),
		e.EventID, e.AggregateType, e.AggregateID, e.AggregateVersion,
		e.EventType, e.EventVersion, e.Destination, e.MessageKey, payload, headers)
	if err != nil {
		return "", fmt.Errorf("outbox: enqueue %s: %w", e.EventID, err)
	}
	if !inserted {
		return "", fmt.Errorf("%w: %s", ErrDuplicateEvent, e.EventID)
	}
	return e.EventID, nil
}

var defaultTable = Table{name: DefaultPrefix + TableSuffix}

// Enqueue writes e into the default table (rmqtx_outbox) inside tx. See
// Table.Enqueue.
func Enqueue(ctx context.Context, tx Execer, e Event) (string, error) {
	return defaultTable.Enqueue(ctx, tx, e)
}

type rowScan struct {
	EventID          string         `db:"event_id"`
	AggregateType    string         `db:"aggregate_type"`
	AggregateID      string         `db:"aggregate_id"`
	AggregateVersion int64          `db:"aggregate_version"`
	EventType        string         `db:"event_type"`
	EventVersion     int            `db:"event_version"`
	Destination      string         `db:"destination"`
	MessageKey       string         `db:"message_key"`
	Payload          []byte         `db:"payload"`
	Headers          sql.NullString `db:"headers"`
	Status           string         `db:"status"`
	OwnerToken       sql.NullString `db:"owner_token"`
	RetryCount       int            `db:"retry_count"`
	LastErrorCode    sql.NullString `db:"last_error_code"`
	LastErrorMessage sql.NullString `db:"last_error_message"`
	// Times scan whatever the DSN's parseTime says (internal/sqltime).
	LeaseUntil  sqltime.NullTime `db:"lease_until"`
	NextRetryAt sqltime.NullTime `db:"next_retry_at"`
	CreatedAt   sqltime.NullTime `db:"created_at"`
	SentAt      sqltime.NullTime `db:"sent_at"`
	UpdatedAt   sqltime.NullTime `db:"updated_at"`
}

const eventColumns = `event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
  destination, message_key, payload, headers, status, owner_token, retry_count`

const rowColumns = eventColumns + `, last_error_code, last_error_message, lease_until, next_retry_at,
  created_at, sent_at, updated_at`

func (r rowScan) event() Event {
	e := Event{
		EventID: r.EventID, EventType: r.EventType, EventVersion: r.EventVersion,
		AggregateType: r.AggregateType, AggregateID: r.AggregateID, AggregateVersion: r.AggregateVersion,
		Destination: r.Destination, MessageKey: r.MessageKey, Payload: r.Payload,
	}
	if r.Headers.Valid && r.Headers.String != "" {
		_ = json.Unmarshal([]byte(r.Headers.String), &e.Headers)
		e.Headers = otelx.StripRow(e.Headers) // the trace context is not a header
	}
	return e
}

func (r rowScan) row() Row {
	return Row{
		Event: r.event(), Status: Status(r.Status), OwnerToken: r.OwnerToken.String,
		LeaseUntil: r.LeaseUntil.Time, RetryCount: r.RetryCount, NextRetryAt: r.NextRetryAt.Time,
		LastErrorCode: r.LastErrorCode.String, LastErrorMessage: r.LastErrorMessage.String,
		CreatedAt: r.CreatedAt.Time, SentAt: r.SentAt.Time, UpdatedAt: r.UpdatedAt.Time,
	}
}

// Get returns the row of eventID, or an error wrapping ErrNotFound.
func (t Table) Get(ctx context.Context, db sqlx.QueryerContext, eventID string) (Row, error) {
	d, err := t.dialectOf(db)
	if err != nil {
		return Row{}, err
	}
	var r rowScan
	err = sqlx.GetContext(ctx, db, &r, d.Rebind("SELECT "+rowColumns+" FROM "+t.name+" WHERE event_id = ?"), eventID)
	if errors.Is(err, sql.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, eventID)
	}
	if err != nil {
		return Row{}, fmt.Errorf("outbox: get %s: %w", eventID, err)
	}
	return r.row(), nil
}

// CountByStatus returns the number of rows in each status.
func (t Table) CountByStatus(ctx context.Context, db sqlx.QueryerContext) (map[Status]int, error) {
	var rows []struct {
		Status string `db:"status"`
		N      int    `db:"n"`
	}
	// No placeholder, so no Rebind: the statement is portable as it is.
	if err := sqlx.SelectContext(ctx, db, &rows, "SELECT status, COUNT(*) AS n FROM "+t.name+" GROUP BY status"); err != nil {
		return nil, fmt.Errorf("outbox: count: %w", err)
	}
	out := map[Status]int{}
	for _, r := range rows {
		out[Status(r.Status)] = r.N
	}
	return out, nil
}
