package replay

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// Table name suffixes of the audit tables this package owns (<prefix><suffix>).
const (
	AuditTable     = "replay_audit"
	AuditItemTable = "replay_audit_item"
	schemaTable    = "replay_schema"
)

// Columns of the audit table that other packages (inspect) select or group on.
const (
	ColResult    = "result"
	ColStartedAt = "started_at"
)

// TableNames are the names of the audit tables under one prefix.
type TableNames struct {
	Audit     string // one row per run: who, why, scope, counts, result
	AuditItem string // one row per dead letter a run touched
}

// Tables returns the audit table names under prefix ("" means
// DefaultTablePrefix), or an error wrapping ErrConfig for an invalid prefix.
func Tables(prefix string) (TableNames, error) {
	t, err := newTables(prefix)
	if err != nil {
		return TableNames{}, err
	}
	return TableNames{Audit: t.audit, AuditItem: t.item}, nil
}

func newTables(prefix string) (tables, error) {
	prefix = sqlname.OrDefault(prefix)
	if err := sqlname.ValidatePrefix(prefix); err != nil {
		return tables{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return tables{audit: prefix + AuditTable, item: prefix + AuditItemTable, schema: prefix + schemaTable}, nil
}

// EventReplayRow is one replay of an event: an audit item joined with its
// run, as ReplaysByEventSQL reads it.
type EventReplayRow struct {
	AuditID      int64     `db:"audit_id" json:"audit_id"`
	DeadLetterID int64     `db:"dead_letter_id" json:"dead_letter_id"`
	Result       string    `db:"result" json:"result"`
	Detail       string    `db:"detail" json:"detail,omitempty"`
	MsgID        string    `db:"msg_id" json:"msg_id,omitempty"`
	At           time.Time `db:"at" json:"at"`
	Operator     string    `db:"operator" json:"operator"`
	Reason       string    `db:"reason" json:"reason"`
}

// ReplaysByEventSQL reads the EventReplayRows of one event id (bind the id),
// in run and dead-letter order.
func (t TableNames) ReplaysByEventSQL() string {
	return "SELECT it.audit_id, it.dead_letter_id, it.result, it.detail, it.msg_id, it.at, a.operator, a.reason FROM " + t.AuditItem +
		" it JOIN " + t.Audit + " a ON a.id = it.audit_id WHERE it.event_id = ? ORDER BY it.audit_id, it.dead_letter_id"
}

// Migrate creates the audit tables (<prefix>replay_audit,
// <prefix>replay_audit_item; "" means DefaultTablePrefix) idempotently and
// records the schema version in <prefix>replay_schema. The consumer tables
// must exist (consumer.Migrate); schema.MigrateAll runs both, in order.
func Migrate(ctx context.Context, db *sqlx.DB, prefix string) error {
	if db == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	t, err := newTables(prefix)
	if err != nil {
		return err
	}
	err = migrate.Run(ctx, db, migrate.Plan{
		FS: migrationFS, Dir: "migrations",
		Replace:     map[string]string{"{{prefix}}": sqlname.OrDefault(prefix)},
		SchemaTable: t.schema,
	})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	return nil
}
