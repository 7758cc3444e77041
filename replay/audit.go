package replay

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/rmqtx/rmqtx/internal/sqltime"
)

// Audit is one replay_audit row.
type Audit struct {
	ID             int64      `db:"id" json:"id"`
	Operator       string     `db:"operator" json:"operator"`
	Reason         string     `db:"reason" json:"reason"`
	Scope          string     `db:"scope" json:"scope"` // the Selector as JSON
	Rate           float64    `db:"rate_limit" json:"rate"`
	Batch          int        `db:"batch_size" json:"batch"`
	Selected       int        `db:"selected" json:"selected"`
	Sent           int        `db:"sent" json:"sent"`
	Failed         int        `db:"failed" json:"failed"`
	Skipped        int        `db:"skipped" json:"skipped"`
	NewDeadLetters int        `db:"new_dead_letters" json:"new_dead_letters"`
	Result         Result     `db:"result" json:"result"`
	ErrorText      string     `db:"-" json:"error,omitempty"`
	StartedAt      time.Time  `db:"-" json:"started_at"`
	FinishedAt     *time.Time `db:"-" json:"finished_at,omitempty"`
}

// AuditItem is one replay_audit_item row.
type AuditItem struct {
	AuditID       int64     `db:"audit_id" json:"audit_id"`
	DeadLetterID  int64     `db:"dead_letter_id" json:"dead_letter_id"`
	ConsumerGroup string    `db:"consumer_group" json:"consumer_group"`
	EventID       string    `db:"event_id" json:"event_id"`
	Topic         string    `db:"topic" json:"topic"`
	Result        string    `db:"result" json:"result"`
	MsgID         string    `db:"msg_id" json:"msg_id"`
	Detail        string    `db:"detail" json:"detail"`
	At            time.Time `db:"-" json:"at"`
}

type auditRow struct {
	Audit
	ErrorText  sql.NullString   `db:"error_text"`
	StartedAt  sqltime.Time     `db:"started_at"`
	FinishedAt sqltime.NullTime `db:"finished_at"`
}

const auditColumns = "id, operator, reason, scope, rate_limit, batch_size, selected, sent, failed, skipped, new_dead_letters, result, error_text, started_at, finished_at"

func (a auditRow) audit() Audit {
	out := a.Audit
	out.ErrorText = a.ErrorText.String
	out.StartedAt = a.StartedAt.Time
	out.FinishedAt = a.FinishedAt.Ptr()
	return out
}

// ErrNotFound is returned by GetAudit for a missing id.
var ErrNotFound = errors.New("replay: not found")

// GetAudit returns one audit row.
func (r *Replayer) GetAudit(ctx context.Context, id int64) (Audit, error) {
	var a auditRow
	err := r.cfg.DB.GetContext(ctx, &a, r.d.Rebind("SELECT "+auditColumns+" FROM "+r.t.audit+" WHERE id = ?"), id)
	if errors.Is(err, sql.ErrNoRows) {
		return Audit{}, fmt.Errorf("%w: audit %d", ErrNotFound, id)
	}
	if err != nil {
		return Audit{}, fmt.Errorf("replay: get audit %d: %w", id, err)
	}
	return a.audit(), nil
}

// ListAudits returns the latest audit rows, newest first (limit default 50).
func (r *Replayer) ListAudits(ctx context.Context, limit int) ([]Audit, error) {
	if limit <= 0 {
		limit = 50
	}
	var rows []auditRow
	if err := r.cfg.DB.SelectContext(ctx, &rows, r.d.Rebind("SELECT "+auditColumns+" FROM "+r.t.audit+" ORDER BY id DESC LIMIT ?"), limit); err != nil {
		return nil, fmt.Errorf("replay: list audits: %w", err)
	}
	out := make([]Audit, len(rows))
	for i, a := range rows {
		out[i] = a.audit()
	}
	return out, nil
}

// AuditItems returns the items of one run in dead-letter id order.
func (r *Replayer) AuditItems(ctx context.Context, auditID int64) ([]AuditItem, error) {
	var rows []struct {
		AuditItem
		At sqltime.Time `db:"at"`
	}
	if err := r.cfg.DB.SelectContext(ctx, &rows, r.d.Rebind("SELECT audit_id, dead_letter_id, consumer_group, event_id, topic, result, msg_id, detail, at FROM "+
		r.t.item+" WHERE audit_id = ? ORDER BY dead_letter_id"), auditID); err != nil {
		return nil, fmt.Errorf("replay: audit items: %w", err)
	}
	items := make([]AuditItem, len(rows))
	for i, row := range rows {
		items[i] = row.AuditItem
		items[i].At = row.At.Time
	}
	return items, nil
}
