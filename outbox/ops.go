package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/retire"
	"github.com/rmqtx/rmqtx/internal/sqltime"
)

// The reads and removals the operator tooling (inspect, archive) runs on
// the outbox. They live here because this package owns the table: no other
// package names its columns or states.

func dialectOf(db *sqlx.DB) (dialect.Dialect, error) {
	d, err := dialect.For(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return d, nil
}

// EventIDsByMessageKey returns the ids of up to limit rows whose message
// key (the business key of an outboxed event) is key.
func (t Table) EventIDsByMessageKey(ctx context.Context, db *sqlx.DB, key string, limit int) ([]string, error) {
	d, err := dialectOf(db)
	if err != nil {
		return nil, err
	}
	var ids []string
	if err := db.SelectContext(ctx, &ids, d.Rebind("SELECT event_id FROM "+t.name+" WHERE message_key = ? LIMIT ?"), key, limit); err != nil {
		return nil, fmt.Errorf("outbox: by message key: %w", err)
	}
	return ids, nil
}

// Unfinished is an outbox row that is not SENT or DEAD yet, as Unfinished
// reads it.
type Unfinished struct {
	EventID          string
	Status           Status
	Destination      string
	EventType        string
	CreatedAt        time.Time
	RetryCount       int
	LeaseUntil       time.Time // zero unless SENDING
	NextRetryAt      time.Time
	LastErrorMessage string
}

// Unfinished returns up to limit rows created at or before createdBefore
// that are PENDING, SENDING or RETRY, oldest first.
func (t Table) Unfinished(ctx context.Context, db *sqlx.DB, createdBefore time.Time, limit int) ([]Unfinished, error) {
	d, err := dialectOf(db)
	if err != nil {
		return nil, err
	}
	var rows []struct {
		EventID     string           `db:"event_id"`
		Status      string           `db:"status"`
		Destination string           `db:"destination"`
		EventType   string           `db:"event_type"`
		CreatedAt   sqltime.Time     `db:"created_at"`
		RetryCount  int              `db:"retry_count"`
		LeaseUntil  sqltime.NullTime `db:"lease_until"`
		NextRetryAt sqltime.Time     `db:"next_retry_at"`
		LastError   *string          `db:"last_error_message"`
	}
	if err := db.SelectContext(ctx, &rows, d.Rebind("SELECT event_id, status, destination, event_type, created_at, retry_count,"+
		" lease_until, next_retry_at, last_error_message FROM "+t.name+
		" WHERE status IN (?, ?, ?) AND created_at <= ? ORDER BY created_at, event_id LIMIT ?"),
		string(StatusPending), string(StatusSending), string(StatusRetry), createdBefore.UTC(), limit); err != nil {
		return nil, fmt.Errorf("outbox: unfinished rows: %w", err)
	}
	out := make([]Unfinished, len(rows))
	for i, r := range rows {
		out[i] = Unfinished{EventID: r.EventID, Status: Status(r.Status), Destination: r.Destination, EventType: r.EventType,
			CreatedAt: r.CreatedAt.Time, RetryCount: r.RetryCount, LeaseUntil: r.LeaseUntil.Time, NextRetryAt: r.NextRetryAt.Time}
		if r.LastError != nil {
			out[i].LastErrorMessage = *r.LastError
		}
	}
	return out, nil
}

// Tally calls fn once per destination and status with the number of rows
// and the oldest creation time.
func (t Table) Tally(ctx context.Context, db *sqlx.DB, fn func(destination, status string, rows int64, oldest time.Time)) error {
	var rows []struct {
		Where  string       `db:"w"`
		Status string       `db:"s"`
		N      int64        `db:"n"`
		Oldest sqltime.Time `db:"o"`
	}
	if err := db.SelectContext(ctx, &rows, "SELECT destination AS w, status AS s, COUNT(*) AS n, MIN(created_at) AS o FROM "+
		t.name+" GROUP BY destination, status"); err != nil {
		return fmt.Errorf("outbox: tally: %w", err)
	}
	for _, r := range rows {
		fn(r.Where, r.Status, r.N, r.Oldest.Time)
	}
	return nil
}

// retirable are the rows in the terminal state st (SENT or DEAD) last
// updated before cutoff. In-flight rows are never selected (I9).
func (t Table) retirable(st Status, cutoff time.Time) (retire.Rule, error) {
	if st != StatusSent && st != StatusDead {
		return retire.Rule{}, fmt.Errorf("%w: only SENT and DEAD rows are retired, not %q", ErrConfig, st)
	}
	// A row becomes SENT or DEAD with next_retry_at set to that moment, so
	// the dispatch index (status, next_retry_at, ...) yields the terminal
	// rows oldest first and a batch reads about limit rows, with no index
	// beyond the dispatcher's own. updated_at still decides: a row made
	// terminal before that rule (its next_retry_at is when it was last
	// due, never later than its last update) or updated since is kept
	// until its last update is past the cutoff.
	cutoff = cutoff.UTC()
	return retire.Rule{Table: t.name, PK: []string{"event_id"}, Where: "status = ? AND next_retry_at < ? AND updated_at < ?",
		Args: []any{string(st), cutoff, cutoff}, OrderBy: "next_retry_at"}, nil
}

// CountRetirable returns the number of rows in the terminal state st (SENT
// or DEAD) last updated before cutoff.
func (t Table) CountRetirable(ctx context.Context, db *sqlx.DB, st Status, cutoff time.Time) (int64, error) {
	d, err := dialectOf(db)
	if err != nil {
		return 0, err
	}
	r, err := t.retirable(st, cutoff)
	if err != nil {
		return 0, err
	}
	n, err := retire.Count(ctx, db, d, r)
	if err != nil {
		return 0, fmt.Errorf("outbox: %w", err)
	}
	return n, nil
}

// RetireBatch removes up to limit of the oldest rows CountRetirable counts,
// in one transaction, first copying them to moveTo when it is set (a table
// created like the outbox when missing). It returns the rows removed and
// moved, and whether more may be left.
func (t Table) RetireBatch(ctx context.Context, db *sqlx.DB, st Status, cutoff time.Time, limit int, moveTo string) (removed, moved int64, more bool, err error) {
	d, err := dialectOf(db)
	if err != nil {
		return 0, 0, false, err
	}
	r, err := t.retirable(st, cutoff)
	if err != nil {
		return 0, 0, false, err
	}
	removed, moved, sel, err := retire.Batch(ctx, db, d, r, limit, moveTo)
	if err != nil {
		return removed, moved, false, fmt.Errorf("outbox: %w", err)
	}
	return removed, moved, sel >= limit, nil
}
