package consumer

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
// the consumer's tables. They live here because this package owns the
// tables: no other package names their columns or states.

// StatusRetrying is how tools show a failed-attempt row: an event that is
// being retried and not applied yet.
const StatusRetrying = "RETRYING"

const (
	consumeLogColumns = "consumer_group, event_type, request_hash, status, result_ref, retry_count, first_received_at, updated_at"
	attemptColumns    = "consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at"
)

// byEvent selects cols of table's rows of one event id, in group order.
// Both tables' primary keys are (consumer_group, event_id), so event_id
// alone reads the whole table (160 ms at 1 M rows). Instead it walks the
// few groups along the primary key and looks up (group, event) in each:
// MariaDB and MySQL read the distinct groups with a loose index scan,
// PostgreSQL, which has none, with a recursive "next group" query. An index
// on event_id would do the same at the price of one more index write per
// first delivery.
func byEvent(d dialect.Dialect, table, cols string) string {
	if d.Name() == "postgres" {
		return "WITH RECURSIVE g(consumer_group) AS (SELECT MIN(consumer_group) FROM " + table +
			" UNION ALL SELECT (SELECT MIN(consumer_group) FROM " + table + " WHERE consumer_group > g.consumer_group) FROM g WHERE g.consumer_group IS NOT NULL)" +
			" SELECT " + cols + " FROM g JOIN " + table + " USING (consumer_group) WHERE event_id = $1 ORDER BY consumer_group"
	}
	return "SELECT " + cols + " FROM (SELECT DISTINCT consumer_group FROM " + table + ") g JOIN " + table +
		" USING (consumer_group) WHERE event_id = ? ORDER BY consumer_group"
}

func dialectOf(db *sqlx.DB) (dialect.Dialect, error) {
	d, err := dialect.For(db)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return d, nil
}

// ConsumeLogByEvent reads the consume-log rows of event id, one per
// consumer group, in group order.
func (t TableNames) ConsumeLogByEvent(ctx context.Context, db *sqlx.DB, id string) ([]ConsumeLogRow, error) {
	d, err := dialectOf(db)
	if err != nil {
		return nil, err
	}
	var rows []ConsumeLogRow
	if err := db.SelectContext(ctx, &rows, byEvent(d, t.ConsumeLog, consumeLogColumns), id); err != nil {
		return nil, fmt.Errorf("consumer: consume log of %s: %w", id, err)
	}
	return rows, nil
}

// AttemptsByEvent reads the failed-attempt rows of event id, in group order.
func (t TableNames) AttemptsByEvent(ctx context.Context, db *sqlx.DB, id string) ([]AttemptRow, error) {
	d, err := dialectOf(db)
	if err != nil {
		return nil, err
	}
	var rows []AttemptRow
	if err := db.SelectContext(ctx, &rows, byEvent(d, t.Attempt, attemptColumns), id); err != nil {
		return nil, fmt.Errorf("consumer: attempts of %s: %w", id, err)
	}
	return rows, nil
}

// AttemptsSince reads up to limit failed-attempt rows whose first failure
// is at or before cutoff, oldest first.
func (t TableNames) AttemptsSince(ctx context.Context, db *sqlx.DB, cutoff time.Time, limit int) ([]AttemptRow, error) {
	d, err := dialectOf(db)
	if err != nil {
		return nil, err
	}
	var rows []AttemptRow
	if err := db.SelectContext(ctx, &rows, d.Rebind("SELECT "+attemptColumns+" FROM "+t.Attempt+
		" WHERE first_failed_at <= ? ORDER BY first_failed_at, consumer_group, event_id LIMIT ?"), cutoff.UTC(), limit); err != nil {
		return nil, fmt.Errorf("consumer: attempts: %w", err)
	}
	return rows, nil
}

// DeadLetterEventIDsByBusinessKey returns the distinct event ids of up to
// limit dead letters carrying business key key.
func (t TableNames) DeadLetterEventIDsByBusinessKey(ctx context.Context, db *sqlx.DB, key string, limit int) ([]string, error) {
	d, err := dialectOf(db)
	if err != nil {
		return nil, err
	}
	var ids []string
	if err := db.SelectContext(ctx, &ids, d.Rebind("SELECT DISTINCT event_id FROM "+t.DeadLetter+" WHERE business_key = ? LIMIT ?"), key, limit); err != nil {
		return nil, fmt.Errorf("consumer: dead letters by business key: %w", err)
	}
	return ids, nil
}

// TallyConsumeLog calls fn once per group and status of the consume log
// with the number of rows and the oldest first-received time.
func (t TableNames) TallyConsumeLog(ctx context.Context, db *sqlx.DB, fn func(group, status string, rows int64, oldest time.Time)) error {
	return tally(ctx, db, "SELECT consumer_group AS w, status AS s, COUNT(*) AS n, MIN(first_received_at) AS o FROM "+
		t.ConsumeLog+" GROUP BY consumer_group, status", fn)
}

// TallyAttempts calls fn once per group of the failed attempts, with status
// StatusRetrying, the number of rows and the oldest first failure.
func (t TableNames) TallyAttempts(ctx context.Context, db *sqlx.DB, fn func(group, status string, rows int64, oldest time.Time)) error {
	return tally(ctx, db, "SELECT consumer_group AS w, '"+StatusRetrying+"' AS s, COUNT(*) AS n, MIN(first_failed_at) AS o FROM "+
		t.Attempt+" GROUP BY consumer_group", fn)
}

// TallyDeadLetters calls fn once per group and status of the dead letters
// with the number of rows and the oldest first-parked time.
func (t TableNames) TallyDeadLetters(ctx context.Context, db *sqlx.DB, fn func(group, status string, rows int64, oldest time.Time)) error {
	return tally(ctx, db, "SELECT consumer_group AS w, status AS s, COUNT(*) AS n, MIN(first_seen_at) AS o FROM "+
		t.DeadLetter+" GROUP BY consumer_group, status", fn)
}

func tally(ctx context.Context, db *sqlx.DB, q string, fn func(group, status string, rows int64, oldest time.Time)) error {
	var rows []struct {
		Group  string       `db:"w"`
		Status string       `db:"s"`
		N      int64        `db:"n"`
		Oldest sqltime.Time `db:"o"`
	}
	if err := db.SelectContext(ctx, &rows, q); err != nil {
		return fmt.Errorf("consumer: tally: %w", err)
	}
	for _, r := range rows {
		fn(r.Group, r.Status, r.N, r.Oldest.Time)
	}
	return nil
}

// Retirable names the consumer tables whose old terminal rows may be
// removed.
type Retirable int

const (
	// RetireConsumeLog: APPLIED and STALE dedup rows last updated before
	// the cutoff. A dedup row removed too early lets a late redelivery
	// apply its event again, so keep it longer than any redelivery.
	RetireConsumeLog Retirable = iota
	// RetireDeadLetters: REPLAYED and DISCARDED dead letters resolved
	// (and last seen) before the cutoff. PARKED ones are never removed.
	RetireDeadLetters
)

func (t TableNames) retirable(which Retirable, cutoff time.Time) (retire.Rule, error) {
	cutoff = cutoff.UTC()
	switch which {
	case RetireConsumeLog:
		return retire.Rule{Table: t.ConsumeLog, PK: []string{"consumer_group", "event_id"},
			Where: "status IN (?, ?) AND updated_at < ?", Args: []any{StatusApplied, StatusStale, cutoff},
			OrderBy: "updated_at"}, nil
	case RetireDeadLetters:
		return retire.Rule{Table: t.DeadLetter, PK: []string{"id"},
			Where: "status IN (?, ?) AND COALESCE(resolved_at, replayed_at, last_seen_at) < ? AND last_seen_at < ?",
			Args:  []any{DeadLetterReplayed, DeadLetterDiscarded, cutoff, cutoff}, OrderBy: "id"}, nil
	}
	return retire.Rule{}, fmt.Errorf("%w: unknown table %d", ErrConfig, which)
}

// CountRetirable returns the number of rows of which that qualify for
// removal at cutoff.
func (t TableNames) CountRetirable(ctx context.Context, db *sqlx.DB, which Retirable, cutoff time.Time) (int64, error) {
	d, err := dialectOf(db)
	if err != nil {
		return 0, err
	}
	r, err := t.retirable(which, cutoff)
	if err != nil {
		return 0, err
	}
	n, err := retire.Count(ctx, db, d, r)
	if err != nil {
		return 0, fmt.Errorf("consumer: %w", err)
	}
	return n, nil
}

// RetireBatch removes up to limit of the oldest qualifying rows of which in
// one transaction, first copying them to moveTo when it is set (a table
// created like the source when missing). It returns the rows removed and
// moved, and whether more may be left.
func (t TableNames) RetireBatch(ctx context.Context, db *sqlx.DB, which Retirable, cutoff time.Time, limit int, moveTo string) (removed, moved int64, more bool, err error) {
	d, err := dialectOf(db)
	if err != nil {
		return 0, 0, false, err
	}
	r, err := t.retirable(which, cutoff)
	if err != nil {
		return 0, 0, false, err
	}
	removed, moved, sel, err := retire.Batch(ctx, db, d, r, limit, moveTo)
	if err != nil {
		return removed, moved, false, fmt.Errorf("consumer: %w", err)
	}
	return removed, moved, sel >= limit, nil
}
