package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
)

// queries holds the dispatcher's SQL for one table. Table names are
// validated identifiers; every value is bound. Statements without an IN
// list are rebound for the dialect here; those with one ("IN (?)") keep
// "?" until inList expands the list and rebinds them.
type queries struct {
	d              dialect.Dialect
	table          string
	stmts          *stmtcache.Cache // the dispatcher's DB; its statements prepared (nil: none)
	claimSteps     [numSteps]string // locking selects, in priority order
	pendingFrom    string           // stepPending resuming at a next_retry_at
	notHeads       string
	takeRows       string
	sqlMarkSent    string
	sqlMarkRetry   string
	sqlMarkDead    string
	sqlRelease     string
	sqlSentMany    string // SENT for the rows of one owner token
	sqlSentLanded  string // which of them carry our SENT
	sqlReleaseMany string // release the rows of one owner token
	// A held claim's outcomes, written in the claim's own transaction (held.go).
	heldSent  string // IN list: rebound by inList
	heldRetry string
	heldDead  string
}

// The claim steps, in priority order. stepPending runs on every claim; the
// other two only when something can be due (see Dispatcher.loop).
const (
	stepExpired = iota // SENDING rows whose lease expired: their owner is gone or stuck
	stepRetry          // RETRY rows whose backoff is over
	stepPending        // PENDING rows
	numSteps
)

// stepSet selects claim steps.
type stepSet [numSteps]bool

var allSteps = stepSet{true, true, true}

type claimedRow struct {
	rowScan
	token    string
	tookOver bool
	// hold is the held claim whose transaction locks the row (held.go); nil
	// when the claim wrote the row SENDING.
	hold *heldClaim
	// claimedAt is taken before the claim transaction begins, so it is never
	// later than the lease's start on the database's clock.
	claimedAt time.Time
}

// claimResult is what one claim transaction took. ran and full say, per
// step, whether it ran and whether it returned as many rows as it asked for
// (so more rows of that kind may be due).
type claimResult struct {
	rows []claimedRow
	ran  stepSet
	full stepSet
	// last is the next_retry_at of the last row the PENDING step read: where
	// the next claim may resume while the step comes back full (nil: from
	// the start).
	last any
	// hold is the open transaction of a held claim that took rows (held.go).
	hold *heldTx
}

// claimScan is a row as a claim step reads it.
type claimScan struct {
	rowScan
	ResumeAt driverValue `db:"resume_at"`
}

// driverValue keeps a column value as the driver returned it, to be bound
// again unchanged: the PENDING step's resume point compares equal to the
// stored next_retry_at whether the DSN hands times over as text or as a
// time.Time in its own location.
type driverValue struct{ v any }

// Scan implements sql.Scanner.
func (r *driverValue) Scan(src any) error {
	if b, ok := src.([]byte); ok {
		src = string(b) // the driver reuses its buffer
	}
	r.v = src
	return nil
}

func newQueries(d dialect.Dialect, table string) queries {
	now := d.Now()
	// head: no earlier version of the same aggregate is still unsent. DEAD
	// does not block: one poison event must not halt its aggregate forever.
	head := `(o.aggregate_type = '' OR NOT EXISTS (SELECT 1 FROM ` + table + ` p
  WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
    AND p.aggregate_version < o.aggregate_version AND p.status IN ('PENDING', 'SENDING', 'RETRY')))`
	sel := "SELECT " + eventColumns + ", o.next_retry_at AS resume_at FROM " + table + " o WHERE "
	lock := " LIMIT ? FOR UPDATE SKIP LOCKED"
	// released: back to PENDING, or RETRY once the row has failed before.
	released := "CASE WHEN retry_count = 0 THEN 'PENDING' ELSE 'RETRY' END"
	return queries{
		d:     d,
		table: table,
		// Each step reads one status in index order, so a step locks at most
		// the rows it returns (an OR over statuses would sort, locking every
		// due row).
		claimSteps: [numSteps]string{
			stepExpired: d.Rebind(sel + "o.status = 'SENDING' AND o.lease_until < " + now + " AND " + head + " ORDER BY o.lease_until" + lock),
			stepRetry:   d.Rebind(sel + "o.status = 'RETRY' AND o.next_retry_at <= " + now + " AND " + head + " ORDER BY o.next_retry_at" + lock),
			stepPending: d.Rebind(sel + "o.status = 'PENDING' AND o.next_retry_at <= " + now + " AND " + head + " ORDER BY o.next_retry_at" + lock),
		},
		// While a backlog drains, the rows a claim took leave delete-marked
		// entries at the start of the PENDING range until purge removes them;
		// a scan from the start walks all of them again on every claim.
		pendingFrom: d.Rebind(sel + "o.status = 'PENDING' AND o.next_retry_at >= ? AND o.next_retry_at <= " + now + " AND " + head +
			" ORDER BY o.next_retry_at" + lock),
		// A plain (non-locking) read of the same condition: it sees every
		// committed row, including rows another claim holds locked, whatever
		// the engine does with SKIP LOCKED inside a subquery.
		notHeads: "SELECT o.event_id FROM " + table + ` o WHERE o.event_id IN (?) AND o.aggregate_type <> '' AND EXISTS (SELECT 1 FROM ` + table + ` p
  WHERE p.aggregate_type = o.aggregate_type AND p.aggregate_id = o.aggregate_id
    AND p.aggregate_version < o.aggregate_version AND p.status IN ('PENDING', 'SENDING', 'RETRY'))`,
		takeRows: "UPDATE " + table + ` SET status = 'SENDING', owner_token = ?,
  lease_until = ` + d.NowPlusMicros() + `, updated_at = ` + now + ` WHERE event_id IN (?)`,
		sqlMarkSent: d.Rebind("UPDATE " + table + ` SET status = 'SENT', sent_at = ` + now + `, next_retry_at = ` + now + `, lease_until = NULL,
  updated_at = ` + now + ` WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`),
		sqlMarkRetry: d.Rebind("UPDATE " + table + ` SET status = 'RETRY', retry_count = retry_count + 1,
  next_retry_at = ` + d.NowPlusMicros() + `, last_error_code = ?, last_error_message = ?,
  lease_until = NULL, updated_at = ` + now + ` WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`),
		sqlMarkDead: d.Rebind("UPDATE " + table + ` SET status = 'DEAD', next_retry_at = ` + now + `, last_error_code = ?, last_error_message = ?,
  lease_until = NULL, updated_at = ` + now + ` WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`),
		sqlRelease: d.Rebind("UPDATE " + table + ` SET status = ` + released + `, next_retry_at = ` + now + `,
  lease_until = NULL, updated_at = ` + now + ` WHERE event_id = ? AND owner_token = ? AND status = 'SENDING'`),
		sqlSentMany: "UPDATE " + table + ` SET status = 'SENT', sent_at = ` + now + `, next_retry_at = ` + now + `, lease_until = NULL,
  updated_at = ` + now + ` WHERE owner_token = ? AND status = 'SENDING' AND event_id IN (?)`,
		// SENT is terminal and every claim has its own token, so a SENT row
		// with our token is one our update wrote.
		sqlSentLanded: "SELECT event_id FROM " + table + ` WHERE owner_token = ? AND status = 'SENT' AND event_id IN (?)`,
		sqlReleaseMany: "UPDATE " + table + ` SET status = ` + released + `, next_retry_at = ` + now + `,
  lease_until = NULL, updated_at = ` + now + ` WHERE owner_token = ? AND status = 'SENDING' AND event_id IN (?)`,
		// The claim's transaction holds these rows' locks, so nothing else
		// changed them since it read them as due, and the caller checks that
		// every row changed (see heldTx). The ids are the only condition: with
		// a status condition beside them, PostgreSQL planned this UPDATE on
		// a table without statistics (a new or bulk-loaded outbox) as a scan
		// of every due row through the dispatch index, each checked against
		// the whole id list: 54 ms for 64 rows of 10 000 against 0.9 ms by
		// primary key, and the bound of the held dispatcher (BENCHMARKS.md).
		heldSent: "UPDATE " + table + ` SET status = 'SENT', owner_token = ?, sent_at = ` + now + `, next_retry_at = ` + now + `, lease_until = NULL,
  updated_at = ` + now + ` WHERE event_id IN (?)`,
		heldRetry: d.Rebind("UPDATE " + table + ` SET status = 'RETRY', owner_token = ?, retry_count = retry_count + 1,
  next_retry_at = ` + d.NowPlusMicros() + `, last_error_code = ?, last_error_message = ?,
  lease_until = NULL, updated_at = ` + now + ` WHERE event_id = ? AND status = ? AND retry_count = ?`),
		heldDead: d.Rebind("UPDATE " + table + ` SET status = 'DEAD', owner_token = ?, next_retry_at = ` + now + `, last_error_code = ?, last_error_message = ?,
  lease_until = NULL, updated_at = ` + now + ` WHERE event_id = ? AND status = ? AND retry_count = ?`),
	}
}

// claim takes up to n due head rows in one short transaction: locking
// selects with SKIP LOCKED (so concurrent dispatchers take disjoint rows),
// then one UPDATE to SENDING with token and a lease, then COMMIT. It runs in
// READ COMMITTED whatever the server's default: the claim needs no
// snapshot, and REPEATABLE READ's gap locks make it deadlock with
// concurrent Enqueues.
func (q queries) claim(ctx context.Context, db *sqlx.DB, token string, n int, lease time.Duration) ([]claimedRow, error) {
	res, err := q.claimWith(ctx, db, token, n, lease, allSteps, nil)
	return res.rows, err
}

// claimWith is claim running only the selected steps (stepPending should
// always be among them). A non-nil from makes the PENDING step skip rows
// due before it (a next_retry_at as claimResult.last returns it): the caller
// must scan from the start again whenever such a row may have become
// claimable.
func (q queries) claimWith(ctx context.Context, db *sqlx.DB, token string, n int, lease time.Duration, steps stepSet, from any) (claimResult, error) {
	claimedAt := time.Now()
	tx, err := dialect.BeginReadCommitted(ctx, db)
	if err != nil {
		return claimResult{}, fmt.Errorf("outbox: claim: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := q.lockDue(ctx, tx, token, n, steps, from, claimedAt)
	if err != nil || len(res.rows) == 0 {
		res.rows = nil
		return res, err
	}
	ids := make([]string, len(res.rows))
	for i := range res.rows {
		ids[i] = res.rows[i].EventID
	}
	query, args, err := q.inList(q.takeRows, []any{token, lease.Microseconds()}, ids)
	if err != nil {
		return claimResult{}, fmt.Errorf("outbox: claim: %w", err)
	}
	if _, err := q.stmts.TxExec(ctx, tx, query, args...); err != nil {
		return claimResult{}, fmt.Errorf("outbox: claim: update: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return claimResult{}, fmt.Errorf("outbox: claim: commit: %w", err)
	}
	return res, nil
}

// lockDue is the reading half of a claim, inside tx: it locks up to n due
// head rows with the selected steps (SKIP LOCKED: rows another claim holds
// are passed over, never waited for) and returns them, stamped with token
// and claimedAt. Nothing is written.
func (q queries) lockDue(ctx context.Context, tx *sqlx.Tx, token string, n int, steps stepSet, from any, claimedAt time.Time) (claimResult, error) {
	var res claimResult
	var rows []claimedRow
	for i, stmt := range q.claimSteps {
		if len(rows) >= n {
			break
		}
		if !steps[i] {
			continue
		}
		var got []claimScan
		want := n - len(rows)
		args := []any{want}
		if i == stepPending && from != nil {
			stmt, args = q.pendingFrom, []any{from, want}
		}
		if err := q.stmts.TxSelect(ctx, tx, &got, stmt, args...); err != nil {
			return res, fmt.Errorf("outbox: claim: select: %w", err)
		}
		res.ran[i] = true
		res.full[i] = len(got) >= want
		if i == stepPending && len(got) > 0 {
			res.last = got[len(got)-1].ResumeAt.v
		}
		for _, r := range got {
			rows = append(rows, claimedRow{rowScan: r.rowScan, tookOver: i == stepExpired, claimedAt: claimedAt})
		}
	}
	if len(rows) == 0 {
		return res, nil
	}
	ids := make([]string, 0, len(rows))
	for _, r := range rows {
		if r.AggregateType != "" {
			ids = append(ids, r.EventID)
		}
	}
	if len(ids) > 0 {
		query, args, err := q.inList(q.notHeads, nil, ids)
		if err != nil {
			return res, fmt.Errorf("outbox: claim: %w", err)
		}
		var drop []string
		if err := q.stmts.TxSelect(ctx, tx, &drop, query, args...); err != nil {
			return res, fmt.Errorf("outbox: claim: head check: %w", err)
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
	for i := range kept {
		kept[i].token = token
	}
	res.rows = kept
	return res, nil
}

// inList binds head, then ids, to query, whose last placeholder is an
// "IN (?)", and rebinds the result for the dialect. The ids are padded to a
// power of two by repeating the last one (harmless in an IN list), so a
// handful of statement texts cover every batch and can be prepared once.
func (q queries) inList(query string, head []any, ids []string) (string, []any, error) {
	size := 1
	for size < len(ids) {
		size *= 2
	}
	padded := make([]string, size)
	copy(padded, ids)
	for i := len(ids); i < size; i++ {
		padded[i] = ids[len(ids)-1]
	}
	query, args, err := sqlx.In(query, append(head, padded)...)
	if err != nil {
		return "", nil, err
	}
	return q.d.Rebind(query), args, nil
}

// exec runs query outside a transaction (prepared, see package stmtcache)
// and returns the number of rows changed.
func (q queries) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := q.stmts.Exec(ctx, query, args...)
	if err != nil {
		return 0, fmt.Errorf("outbox: mark: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: mark: %w", err)
	}
	return n, nil
}

func (q queries) markSent(ctx context.Context, id, token string) (int64, error) {
	return q.exec(ctx, q.sqlMarkSent, id, token)
}

func (q queries) markRetry(ctx context.Context, id, token string, delay time.Duration, code, msg string) (int64, error) {
	return q.exec(ctx, q.sqlMarkRetry, delay.Microseconds(), code, msg, id, token)
}

func (q queries) markDead(ctx context.Context, id, token, code, msg string) (int64, error) {
	return q.exec(ctx, q.sqlMarkDead, code, msg, id, token)
}

func (q queries) release(ctx context.Context, id, token string) (int64, error) {
	return q.exec(ctx, q.sqlRelease, id, token)
}

// maxInList bounds the ids of one batched statement.
const maxInList = 500

// markSentMany marks SENT the rows of ids that token still owns (at most
// maxInList ids) in one statement, and returns the ids it marked. Only when
// fewer rows changed than ids were given does it read back which ones.
func (q queries) markSentMany(ctx context.Context, token string, ids []string) (map[string]bool, error) {
	query, args, err := q.inList(q.sqlSentMany, []any{token}, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: mark: %w", err)
	}
	n, err := q.exec(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	landed := make(map[string]bool, len(ids))
	if n >= int64(len(ids)) {
		for _, id := range ids {
			landed[id] = true
		}
		return landed, nil
	}
	// Some rows have a new owner, or an earlier attempt of this very update
	// committed without its reply reaching us: read which rows are ours.
	query, args, err = q.inList(q.sqlSentLanded, []any{token}, ids)
	if err != nil {
		return nil, fmt.Errorf("outbox: mark: %w", err)
	}
	var got []string
	if err := q.stmts.Select(ctx, &got, query, args...); err != nil {
		return nil, fmt.Errorf("outbox: mark: read back: %w", err)
	}
	for _, id := range got {
		landed[id] = true
	}
	return landed, nil
}

// releaseMany hands back the rows of ids that token still owns (at most
// maxInList ids) and returns how many it changed.
func (q queries) releaseMany(ctx context.Context, token string, ids []string) (int64, error) {
	query, args, err := q.inList(q.sqlReleaseMany, []any{token}, ids)
	if err != nil {
		return 0, fmt.Errorf("outbox: release: %w", err)
	}
	return q.exec(ctx, query, args...)
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
	d, err := t.dialectOf(db)
	if err != nil {
		return nil, err
	}
	var rows []struct {
		Destination string `db:"destination"`
		Pending     int64  `db:"pending"`
		Sending     int64  `db:"sending"`
		OldestUS    int64  `db:"oldest_us"`
	}
	// No placeholder, so no Rebind.
	err = sqlx.SelectContext(ctx, db, &rows, `SELECT destination,
  COUNT(CASE WHEN status IN ('PENDING', 'RETRY') THEN 1 END) AS pending,
  COUNT(CASE WHEN status = 'SENDING' THEN 1 END) AS sending,
  COALESCE(`+d.MicrosSince("MIN(created_at)")+`, 0) AS oldest_us
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
