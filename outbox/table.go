package outbox

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// DefaultPrefix is the table prefix used when none is configured: the one
// rmqtx default (internal/sqlname), shared by every package.
const DefaultPrefix = sqlname.DefaultPrefix

// TableSuffix: the outbox lives in <prefix>outbox.
const TableSuffix = "outbox"

// Columns of the outbox that other packages (inspect, archive) select or
// filter on. A column renamed here is renamed for all of them.
const (
	ColEventID     = "event_id"
	ColDestination = "destination"
	ColEventType   = "event_type"
	ColMessageKey  = "message_key"
	ColStatus      = "status"
	ColRetryCount  = "retry_count"
	ColLeaseUntil  = "lease_until"
	ColNextRetryAt = "next_retry_at"
	ColLastError   = "last_error_message"
	ColCreatedAt   = "created_at"
	ColUpdatedAt   = "updated_at"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// Execer is what Enqueue needs from the caller's transaction: *sql.Tx and
// *sqlx.Tx both satisfy it. Pass the transaction that holds the business
// change; passing a *sql.DB works but loses the atomicity the outbox is for.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Table is the outbox table under one prefix. It is a cheap value with no
// connection of its own; the zero value is not usable, use NewTable.
type Table struct {
	name   string // prefix + "outbox"
	schema string // prefix + "outbox_schema"
}

// NewTable returns the outbox table <prefix>outbox. An empty prefix means
// DefaultPrefix. The prefix is validated with internal/sqlname.
func NewTable(prefix string) (Table, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	name, err := sqlname.Table(prefix, TableSuffix)
	if err != nil {
		return Table{}, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return Table{name: name, schema: name + "_schema"}, nil
}

// Name returns the table name, for example "rmqtx_outbox".
func (t Table) Name() string { return t.name }

// Migrate creates or upgrades the outbox table. It is idempotent and safe to
// run from several processes at once: migrations are serialized with a named
// lock (GET_LOCK) and recorded in <prefix>outbox_schema. Works on MariaDB
// 10.6+ and MySQL 8.
func (t Table) Migrate(ctx context.Context, db *sqlx.DB) error {
	err := migrate.Run(ctx, db, migrate.Plan{
		FS: migrationFS, Dir: "migrations",
		Replace:     map[string]string{"{{table}}": t.name},
		SchemaTable: t.schema,
	})
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	return nil
}

// Migrate creates or upgrades the outbox table <prefix>outbox (empty prefix:
// DefaultPrefix). See Table.Migrate; schema.MigrateAll runs it together
// with every other rmqtx table.
func Migrate(ctx context.Context, db *sqlx.DB, prefix string) error {
	t, err := NewTable(prefix)
	if err != nil {
		return err
	}
	return t.Migrate(ctx, db)
}

// Enqueue writes e as a PENDING row inside the caller's transaction tx and
// returns its event id (generated when e.EventID is empty). The row becomes
// visible to dispatchers when tx commits; call Dispatcher.Notify after the
// commit to send it at once instead of at the next poll.
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
		e.EventID = envelope.NewEventID()
	}
	if err := e.Validate(); err != nil {
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
	_, err := tx.ExecContext(ctx, "INSERT INTO "+t.name+` (event_id, aggregate_type, aggregate_id, aggregate_version,
  event_type, event_version, destination, message_key, payload, headers, status, retry_count,
  next_retry_at, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'PENDING', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))`,
		e.EventID, e.AggregateType, e.AggregateID, e.AggregateVersion,
		e.EventType, e.EventVersion, e.Destination, e.MessageKey, payload, headers)
	if err != nil {
		if isDuplicateKey(err) {
			return "", fmt.Errorf("%w: %s", ErrDuplicateEvent, e.EventID)
		}
		return "", fmt.Errorf("outbox: enqueue %s: %w", e.EventID, err)
	}
	return e.EventID, nil
}

var defaultTable = Table{name: DefaultPrefix + TableSuffix, schema: DefaultPrefix + TableSuffix + "_schema"}

// Enqueue writes e into the default table (rmqtx_outbox) inside tx. See
// Table.Enqueue.
func Enqueue(ctx context.Context, tx Execer, e Event) (string, error) {
	return defaultTable.Enqueue(ctx, tx, e)
}

// tsExpr renders a DATETIME(6) column as text so scanning does not depend
// on the DSN's parseTime setting.
func tsExpr(col string) string {
	return "COALESCE(DATE_FORMAT(" + col + ", '%Y-%m-%d %H:%i:%s.%f'), '')"
}

func parseTS(s string) time.Time {
	if s == "" {
		return time.Time{}
	}
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.UTC)
	if err != nil {
		return time.Time{}
	}
	return t
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
	LeaseUntil       string         `db:"lease_until_s"`
	NextRetryAt      string         `db:"next_retry_at_s"`
	CreatedAt        string         `db:"created_at_s"`
	SentAt           string         `db:"sent_at_s"`
	UpdatedAt        string         `db:"updated_at_s"`
}

const eventColumns = `event_id, aggregate_type, aggregate_id, aggregate_version, event_type, event_version,
  destination, message_key, payload, headers, status, owner_token, retry_count`

func (t Table) rowColumns() string {
	return eventColumns + `, last_error_code, last_error_message, ` +
		tsExpr("lease_until") + ` AS lease_until_s, ` + tsExpr("next_retry_at") + ` AS next_retry_at_s, ` +
		tsExpr("created_at") + ` AS created_at_s, ` + tsExpr("sent_at") + ` AS sent_at_s, ` +
		tsExpr("updated_at") + ` AS updated_at_s`
}

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
		LeaseUntil: parseTS(r.LeaseUntil), RetryCount: r.RetryCount, NextRetryAt: parseTS(r.NextRetryAt),
		LastErrorCode: r.LastErrorCode.String, LastErrorMessage: r.LastErrorMessage.String,
		CreatedAt: parseTS(r.CreatedAt), SentAt: parseTS(r.SentAt), UpdatedAt: parseTS(r.UpdatedAt),
	}
}

// Get returns the row of eventID, or an error wrapping ErrNotFound.
func (t Table) Get(ctx context.Context, db sqlx.QueryerContext, eventID string) (Row, error) {
	var r rowScan
	err := sqlx.GetContext(ctx, db, &r, "SELECT "+t.rowColumns()+" FROM "+t.name+" WHERE event_id = ?", eventID)
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
	if err := sqlx.SelectContext(ctx, db, &rows, "SELECT status, COUNT(*) AS n FROM "+t.name+" GROUP BY status"); err != nil {
		return nil, fmt.Errorf("outbox: count: %w", err)
	}
	out := map[Status]int{}
	for _, r := range rows {
		out[Status(r.Status)] = r.N
	}
	return out, nil
}
