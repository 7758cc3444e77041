package txlog

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/sqltime"
)

// HalfProperty is the key, in a row's Properties, of the UNIQ_KEY of the
// half message the row decides: the half whose local transaction wrote it,
// or the half a check or recovery fenced. It is rocketmq-client-go's
// primitive.PropertyUniqueClientMessageIdKeyIndex.
const HalfProperty = "UNIQ_KEY"

// Half returns the UNIQ_KEY of the half message the row decides (see
// HalfProperty), or "" when the row does not name one (rows written before
// rmqtx recorded it, resolver rows).
func (r Row) Half() string {
	if r.Properties == "" {
		return ""
	}
	var props map[string]string
	if json.Unmarshal([]byte(r.Properties), &props) != nil {
		return ""
	}
	return props[HalfProperty]
}

// HalfProperties is the Properties of a row that names half and nothing
// else (fence rows).
func HalfProperties(half string) string {
	if half == "" {
		return ""
	}
	b, _ := json.Marshal(map[string]string{HalfProperty: half})
	return string(b)
}

// Retakable reports whether row, a decision for some half of its event id,
// leaves half free to commit the id: row is ROLLED_BACK and names another
// half. Such a row says nothing about half; a Send of half may take the id
// over (Retake) unless a fence of half got there first (Fence).
//
// A ROLLED_BACK row that names no half (written before rmqtx recorded
// halves) stays final for every half: nobody can retake it.
func Retakable(row Row, half string) bool {
	named := row.Half()
	return row.State == StateRolledBack && half != "" && named != "" && named != half
}

// Retake lets a new Send commit an event id whose row records a rollback.
// It runs in the caller's transaction tx, in place of Insert, after Insert
// found the id taken: it locks the row, and when the row is ROLLED_BACK,
// names a half other than r's, and was resolved before startedAt, it
// replaces the row with r (r's half becomes the one that may commit the
// id; every other half of the id is answered ROLLBACK, see Row.Half) and
// reports true. The row stays locked until tx ends: a check or recovery
// that fences meanwhile waits on it, and sees r if tx commits or the old
// row if it rolls back. Otherwise it changes nothing and reports false:
// the row is committed, or final for every half, or a fence of r's half
// may already have been answered.
//
// startedAt is when the Send began, before its half message was sent, on
// the clock of the process that sent it. A check that fences r's half does
// so only once that half is FenceAge old on its own clock, and raises the
// row's resolved_at to its own now (Fence): so resolved_at >= startedAt
// then, whatever the skew between the two clocks, and the Send cannot
// retake the row after its half was answered ROLLBACK. An earlier rollback
// on another instance with a clock ahead of this one's can refuse a retake
// that would have been safe; a later Send (a later startedAt) takes it.
func (s *Store) Retake(ctx context.Context, tx *sqlx.Tx, r Row, startedAt time.Time) (bool, error) {
	half := r.Half()
	if half == "" {
		return false, invalid("retake of %s: the row must name its half (Properties %s)", r.EventID, HalfProperty)
	}
	var cur struct {
		State      string         `db:"state"`
		Properties sql.NullString `db:"properties"`
		ResolvedAt sqltime.Time   `db:"resolved_at"`
	}
	err := tx.GetContext(ctx, &cur, s.d.Rebind("SELECT state, properties, resolved_at FROM "+s.table+" WHERE event_id = ? FOR UPDATE"), r.EventID)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Removed meanwhile (retention): this Send's own insert decides.
		if err := s.Insert(ctx, tx, r); err != nil {
			return false, err
		}
		return true, nil
	case err != nil:
		return false, fmt.Errorf("txlog: retake %s: lock: %w", r.EventID, err)
	}
	row := Row{EventID: r.EventID, State: State(cur.State), Properties: cur.Properties.String}
	if !Retakable(row, half) || !cur.ResolvedAt.Time.Before(startedAt) {
		return false, nil
	}
	if _, err := tx.ExecContext(ctx, s.d.Rebind("DELETE FROM "+s.table+" WHERE event_id = ?"), r.EventID); err != nil {
		return false, fmt.Errorf("txlog: retake %s: %w", r.EventID, err)
	}
	r.CreatedAt, r.ResolvedAt = time.Time{}, time.Time{}
	if err := s.Insert(ctx, tx, r); err != nil {
		return false, err
	}
	return true, nil
}

// fenceHalf raises the resolved_at of a ROLLED_BACK row to now, so that
// no Send that began before now can Retake it: the half the caller fences
// can never commit the id afterwards. It waits on the lock of a Retake in
// flight and then acts on what that left (a committed row is not touched),
// and returns the row as it stands.
func (s *Store) fenceHalf(ctx context.Context, id string) (Row, error) {
	now := s.now()
	q := s.d.Rebind("UPDATE " + s.table + " SET resolved_at = ? WHERE event_id = ? AND state = ? AND resolved_at < ?")
	err := s.d.LatestCommitted(ctx, s.db, func(ctx context.Context, e sqlx.ExtContext) error {
		_, err := e.ExecContext(ctx, q, now.UTC(), id, string(StateRolledBack), now.UTC())
		return err
	})
	if err != nil {
		return Row{}, fmt.Errorf("txlog: fence %s: %w", id, err)
	}
	return s.Get(ctx, id)
}
