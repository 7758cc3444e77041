package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
)

// queries holds the dispatcher's SQL for one table. Table names are
// validated identifiers; every value is bound.
type queries struct {
	table        string
	claimSteps   []string // locking selects, in priority order
	notHeads     string
	takeRows     string
	sqlMarkSent  string
	sqlMarkRetry string
	sqlMarkDead  string
	sqlRelease   string
}

type claimedRow struct {
	rowScan
	token    string
	tookOver bool
}

func newQueries(table string) queries {
	// head: no earlier version of the same aggregate is still unsent. DEAD
	// does not block: one poison event must not halt its aggregate forever.
	head := `(o.aggregate_type = '' OR NOT EXISTS (SELECT 1 FROM ` + table + ` p
  WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
    AND p.aggregate_version < o.aggregate_version AND p.status IN ('PENDING', 'SENDING', 'RETRY')))`
	sel := "SELECT " + eventColumns + " FROM " + table + " o WHERE "
	lock := " LIMIT ? FOR UPDATE SKIP LOCKED"
	return queries{
		table: table,
		claimSteps: []string{
			// expired leases first: their owner is gone or stuck
			sel + "o.status = 'SENDING' AND o.lease_until < UTC_TIMESTAMP(6) AND " + head + " ORDER BY o.lease_until" + lock,
			sel + "o.status = 'RETRY' AND o.next_retry_at <= UTC_TIMESTAMP(6) AND " + head + " ORDER BY o.next_retry_at" + lock,
			sel + "o.status = 'PENDING' AND o.next_retry_at <= UTC_TIMESTAMP(6) AND " + head + " ORDER BY o.next_retry_at" + lock,
		},
		// A plain (non-locking) read of the same condition: it sees every
		// committed row, including rows another claim holds locked, whatever
		// the engine does with SKIP LOCKED inside a subquery.
		notHeads: "SELECT o.event_id FROM " + table + ` o WHERE o.event_id IN (?) AND o.aggregate_type <> '' AND EXISTS (SELECT 1 FROM ` + table + ` p
  WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
    AND p.aggregate_version < o.aggregate_version AND p.status IN ('PENDING', 'SENDING', 'RETRY'))`,
		takeRows: "UPDATE " + table + ` SET status = 'SENDING', owner_token = ?,
  lease_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, updated_at = UTC_TIMESTAMP(6) WHERE event_id IN (?)`,
		sqlMarkSent: "UPDATE " + table + ` SET status = 'SENT', sent_at = UTC_TIMESTAMP(6), lease_until = NULL,
  updated_at = UTC_TIMESTAMP(6) WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`,
		sqlMarkRetry: "UPDATE " + table + ` SET status = 'RETRY', retry_count = retry_count + 1,
  next_retry_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, last_error_code = ?, last_error_message = ?,
  lease_until = NULL, updated_at = UTC_TIMESTAMP(6) WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`,
		sqlMarkDead: "UPDATE " + table + ` SET status = 'DEAD', last_error_code = ?, last_error_message = ?,
  lease_until = NULL, updated_at = UTC_TIMESTAMP(6) WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`,
		sqlRelease: "UPDATE " + table + ` SET status = IF(retry_count = 0, 'PENDING', 'RETRY'), next_retry_at = UTC_TIMESTAMP(6),
  lease_until = NULL, updated_at = UTC_TIMESTAMP(6) WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`,
	}
}

// claim takes up to n due head rows in one short transaction: locking
// selects with SKIP LOCKED (so concurrent dispatchers take disjoint rows),
// then one UPDATE to SENDING with token and a lease, then COMMIT. It runs in
// READ COMMITTED whatever the server's default: the claim needs no
// snapshot, and REPEATABLE READ's gap locks make it deadlock with
// concurrent Enqueues.
func (q queries) claim(ctx context.Context, db *sqlx.DB, token string, n int, lease time.Duration) ([]claimedRow, error) {
	tx, err := db.BeginTxx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	var rows []claimedRow
	for i, stmt := range q.claimSteps {
		if len(rows) >= n {
			break
		}
		var got []rowScan
		if err := tx.SelectContext(ctx, &got, stmt, n-len(rows)); err != nil {
			return nil, fmt.Errorf("outbox: claim: select: %w", err)
		}
		for _, r := range got {
			rows = append(rows, claimedRow{rowScan: r, tookOver: i == 0})
		}
	}
	if len(rows) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(rows))
	for _, r := range rows {
		if r.AggregateType != "" {
			ids = append(ids, r.EventID)
		}
	}
	if len(ids) > 0 {
		query, args, err := sqlx.In(q.notHeads, ids)
		if err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		var drop []string
		if err := tx.SelectContext(ctx, &drop, query, args...); err != nil {
			return nil, fmt.Errorf("outbox: claim: head check: %w", err)
		}
		if len(drop) > 0 {
			skip := make(map[string]bool, len(drop))
			for _, id := range drop {
				skip[id] = true
			}
			kept := rows[:0]
			for _, r := range rows {
				if !skip[r.EventID] {
					kept = append(kept, r)
				}
			}
			rows = kept
		}
	}
	// Two versions of one aggregate can both look like heads only when they
	// share a version number; keep one per aggregate per claim anyway.
	seen := map[string]bool{}
	kept := rows[:0]
	for _, r := range rows {
		if r.AggregateType != "" {
			k := r.AggregateType + "\x00" + r.AggregateID
			if seen[k] {
				continue
			}
			seen[k] = true
		}
		kept = append(kept, r)
	}
	rows = kept
	if len(rows) == 0 {
		return nil, nil
	}
	ids = ids[:0]
	for i := range rows {
		ids = append(ids, rows[i].EventID)
		rows[i].token = token
	}
	query, args, err := sqlx.In(q.takeRows, token, lease.Microseconds(), ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	if _, err := tx.ExecContext(ctx, query, args...); err != nil {
		return nil, fmt.Errorf("outbox: claim: update: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("outbox: claim: commit: %w", err)
	}
	return rows, nil
}

func execCount(ctx context.Context, db *sqlx.DB, query string, args ...any) (int64, error) {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: mark: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: mark: %w", err)
	}
	return n, nil
}

func (q queries) markSent(ctx context.Context, db *sqlx.DB, id, token string) (int64, error) {
	return execCount(ctx, db, q.sqlMarkSent, id, token)
}

func (q queries) markRetry(ctx context.Context, db *sqlx.DB, id, token string, delay time.Duration, code, msg string) (int64, error) {
	return execCount(ctx, db, q.sqlMarkRetry, delay.Microseconds(), code, msg, id, token)
}

func (q queries) markDead(ctx context.Context, db *sqlx.DB, id, token, code, msg string) (int64, error) {
	return execCount(ctx, db, q.sqlMarkDead, code, msg, id, token)
}

func (q queries) release(ctx context.Context, db *sqlx.DB, id, token string) (int64, error) {
	return execCount(ctx, db, q.sqlRelease, id, token)
}

// Backlog is the unsent work for one destination.
type Backlog struct {
	Destination string
	Pending     int64         // PENDING or RETRY rows
	Sending     int64         // SENDING rows
	OldestAge   time.Duration // age of the oldest row not SENT or DEAD
}

// Backlog returns the unsent rows per destination (what the OutboxPending
// and OutboxOldestAge gauges show).
func (t Table) Backlog(ctx context.Context, db sqlx.QueryerContext) ([]Backlog, error) {
	var rows []struct {
		Destination string `db:"destination"`
		Pending     int64  `db:"pending"`
		Sending     int64  `db:"sending"`
		OldestUS    int64  `db:"oldest_us"`
	}
	err := sqlx.SelectContext(ctx, db, &rows, `SELECT destination,
  CAST(SUM(status IN ('PENDING', 'RETRY')) AS SIGNED) AS pending,
  CAST(SUM(status = 'SENDING') AS SIGNED) AS sending,
  COALESCE(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)), 0) AS oldest_us
FROM `+t.name+` WHERE status IN ('PENDING', 'RETRY', 'SENDING') GROUP BY destination`)
	if err != nil {
		return nil, fmt.Errorf("outbox: backlog: %w", err)
	}
	out := make([]Backlog, 0, len(rows))
	for _, r := range rows {
		out = append(out, Backlog{Destination: r.Destination, Pending: r.Pending, Sending: r.Sending,
			OldestAge: time.Duration(r.OldestUS) * time.Microsecond})
	}
	return out, nil
}
