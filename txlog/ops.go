package txlog

import (
	"context"
	"fmt"
	"time"

	"github.com/rmqtx/rmqtx/internal/retire"
	"github.com/rmqtx/rmqtx/internal/sqltime"
)

// The reads and removals the operator tooling (inspect, archive) runs on
// the log. They live here because this package owns the table: no other
// package names its columns or states.

// EventIDsByBusinessKey returns the ids of up to limit events carrying
// business key key.
func (s *Store) EventIDsByBusinessKey(ctx context.Context, key string, limit int) ([]string, error) {
	var ids []string
	if err := s.db.SelectContext(ctx, &ids, s.d.Rebind("SELECT event_id FROM "+s.table+" WHERE business_key = ? LIMIT ?"), key, limit); err != nil {
		return nil, fmt.Errorf("txlog: by business key: %w", err)
	}
	return ids, nil
}

// Tally calls fn once per producer group and state with the number of rows
// and the creation time of the oldest.
func (s *Store) Tally(ctx context.Context, fn func(group, state string, rows int64, oldest time.Time)) error {
	var rows []struct {
		Group  string       `db:"w"`
		State  string       `db:"s"`
		N      int64        `db:"n"`
		Oldest sqltime.Time `db:"o"`
	}
	if err := s.db.SelectContext(ctx, &rows, "SELECT producer_group AS w, state AS s, COUNT(*) AS n, MIN(created_at) AS o FROM "+
		s.table+" GROUP BY producer_group, state"); err != nil {
		return fmt.Errorf("txlog: tally: %w", err)
	}
	for _, r := range rows {
		fn(r.Group, r.State, r.N, r.Oldest.Time)
	}
	return nil
}

// retirable are the rows resolved before cutoff. Every row of this log is
// terminal; the state predicate keeps it so should an in-flight state
// appear (I9).
// One index range per state: see retire.Rule.Parts.
func (s *Store) retirable(cutoff time.Time) retire.Rule {
	cutoff = cutoff.UTC()
	return retire.Rule{Table: s.table, PK: []string{"event_id"},
		Where: "state IN (?, ?) AND resolved_at < ?", Args: []any{string(StateCommitted), string(StateRolledBack), cutoff},
		OrderBy: "resolved_at",
		Parts: []retire.Part{
			{Where: "state = ? AND resolved_at < ?", Args: []any{string(StateCommitted), cutoff}},
			{Where: "state = ? AND resolved_at < ?", Args: []any{string(StateRolledBack), cutoff}},
		}}
}

// CountRetirable returns the number of rows resolved before cutoff.
func (s *Store) CountRetirable(ctx context.Context, cutoff time.Time) (int64, error) {
	n, err := retire.Count(ctx, s.db, s.d, s.retirable(cutoff))
	if err != nil {
		return 0, fmt.Errorf("txlog: %w", err)
	}
	return n, nil
}

// RetireBatch removes up to limit of the oldest rows resolved before cutoff
// in one transaction, first copying them to moveTo when it is set (a table
// created like the log when missing). It returns the rows removed and
// moved, and whether more may be left.
func (s *Store) RetireBatch(ctx context.Context, cutoff time.Time, limit int, moveTo string) (removed, moved int64, more bool, err error) {
	removed, moved, sel, err := retire.Batch(ctx, s.db, s.d, s.retirable(cutoff), limit, moveTo)
	if err != nil {
		return removed, moved, false, fmt.Errorf("txlog: %w", err)
	}
	return removed, moved, sel >= limit, nil
}
