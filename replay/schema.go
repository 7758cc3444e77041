package replay

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/internal/sqltime"
)

// Table name suffixes of the audit tables this package owns (<prefix><suffix>).
const (
	AuditTable     = "replay_audit"
	AuditItemTable = "replay_audit_item"
)

// TableNames are the names of the audit tables under one prefix.
type TableNames struct {
	Audit     string // one row per run: who, why, scope, counts, result
	AuditItem string // one row per dead letter a run touched
}

// Tables returns the audit table names under prefix ("" means
// DefaultPrefix), or an error wrapping ErrConfig for an invalid prefix.
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
	return tables{audit: prefix + AuditTable, item: prefix + AuditItemTable}, nil
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

// ReplaysByEvent reads the EventReplayRows of event id, in run and
// dead-letter order.
func (t TableNames) ReplaysByEvent(ctx context.Context, db *sqlx.DB, id string) ([]EventReplayRow, error) {
	d, err := dialect.For(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var rows []EventReplayRow
	if err := db.SelectContext(ctx, &rows, d.Rebind("SELECT it.audit_id, it.dead_letter_id, it.result, it.detail, it.msg_id, it.at, a.operator, a.reason FROM "+
		t.AuditItem+" it JOIN "+t.Audit+" a ON a.id = it.audit_id WHERE it.event_id = ? ORDER BY it.audit_id, it.dead_letter_id"), id); err != nil {
		return nil, fmt.Errorf("replay: replays of %s: %w", id, err)
	}
	return rows, nil
}

// Tally calls fn once per audit result with the number of runs and the
// start of the oldest.
func (t TableNames) Tally(ctx context.Context, db *sqlx.DB, fn func(result string, runs int64, oldest time.Time)) error {
	var rows []struct {
		Result string       `db:"s"`
		N      int64        `db:"n"`
		Oldest sqltime.Time `db:"o"`
	}
	if err := db.SelectContext(ctx, &rows, "SELECT result AS s, COUNT(*) AS n, MIN(started_at) AS o FROM "+t.Audit+" GROUP BY result"); err != nil {
		return fmt.Errorf("replay: tally: %w", err)
	}
	for _, r := range rows {
		fn(r.Result, r.N, r.Oldest.Time)
	}
	return nil
}

//go:embed migrations
var migrationFS embed.FS

// Migrations returns the package's schema steps for the dialect named d
// ("mysql"): the NNN_description.sql files of one folder, and the validated
// names that fill their {{...}} placeholders under prefix ("" means
// DefaultPrefix). The audit tables refer to the consumer's dead
// letters, so schema.MigrateAll runs them after the consumer's.
func Migrations(d, prefix string) (fs.FS, map[string]string, error) {
	fsys, err := fs.Sub(migrationFS, "migrations/"+d)
	if err == nil {
		_, err = fs.Stat(fsys, ".")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: no migrations for database %q", ErrConfig, d)
	}
	if _, err := newTables(prefix); err != nil {
		return nil, nil, err
	}
	return fsys, map[string]string{"{{prefix}}": sqlname.OrDefault(prefix)}, nil
}
