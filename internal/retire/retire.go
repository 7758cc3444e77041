// Package retire is the mechanics of removing terminal rows from an rmqtx
// table, shared by the tables' owners: each owner says which of its rows
// are terminal (a Rule) and calls Count and Batch; the archive package
// decides retention and loops. A batch locks the rows that still match,
// optionally copies them to an archive table, and deletes exactly them, in
// one transaction, so a row that left its terminal state between the
// select and the delete is never removed (I9).
package retire

import (
	"context"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// Rule selects an owner's terminal rows.
type Rule struct {
	Table   string   // validated table name
	PK      []string // primary-key columns
	Where   string   // predicate with "?" placeholders, bound to Args
	Args    []any
	OrderBy string // oldest first
	// Parts, when set, split Where into predicates that each read one
	// index range already in OrderBy order, e.g. one per terminal state
	// over an index (state, resolved_at). The batch then takes the oldest
	// rows of each part and orders only those, instead of sorting every
	// row Where selects (with "state IN (a, b)" no index yields the rows
	// in resolved_at order: each batch sorted the whole eligible set).
	// Their union must be exactly Where, which still decides the lock.
	Parts []Part
}

// Part is one predicate of Rule.Parts.
type Part struct {
	Where string
	Args  []any
}

// SelectOldest renders the batch's select of the oldest limit keys (its
// arguments bound), for Batch and for tests that read its plan.
func (r Rule) SelectOldest(limit int) (string, []any) {
	pk := strings.Join(r.PK, ", ")
	if len(r.Parts) == 0 {
		return "SELECT " + pk + " FROM " + r.Table + " WHERE " + r.Where + " ORDER BY " + r.OrderBy + " LIMIT ?",
			append(append([]any{}, r.Args...), limit)
	}
	var subs []string
	var args []any
	for _, p := range r.Parts {
		subs = append(subs, "(SELECT "+pk+", "+r.OrderBy+" FROM "+r.Table+" WHERE "+p.Where+" ORDER BY "+r.OrderBy+" LIMIT ?)")
		args = append(append(args, p.Args...), limit)
	}
	return "SELECT " + pk + " FROM (" + strings.Join(subs, " UNION ALL ") + ") oldest ORDER BY " + r.OrderBy + " LIMIT ?",
		append(args, limit)
}

// Count returns the number of rows r selects.
func Count(ctx context.Context, db *sqlx.DB, d dialect.Dialect, r Rule) (int64, error) {
	var n int64
	if err := db.GetContext(ctx, &n, d.Rebind("SELECT COUNT(*) FROM "+r.Table+" WHERE "+r.Where), r.Args...); err != nil {
		return 0, fmt.Errorf("count %s: %w", r.Table, err)
	}
	return n, nil
}

// Exists reports whether table exists in the current database.
func Exists(ctx context.Context, db *sqlx.DB, d dialect.Dialect, table string) (bool, error) {
	var n int
	if err := db.GetContext(ctx, &n, d.Rebind(d.TableExistsQuery()), table); err != nil {
		return false, fmt.Errorf("look up table %s: %w", table, err)
	}
	return n > 0, nil
}

// Batch removes up to limit of the oldest rows r selects; with moveTo set
// it first copies them there (a table created like r.Table when missing; a
// row archived twice is replaced). It returns how many rows it removed and
// moved, and how many it selected (fewer than limit: nothing is left).
func Batch(ctx context.Context, db *sqlx.DB, d dialect.Dialect, r Rule, limit int, moveTo string) (removed, moved int64, selected int, err error) {
	if moveTo != "" {
		if _, err := db.ExecContext(ctx, d.CreateTableLike(moveTo, r.Table)); err != nil {
			return 0, 0, 0, fmt.Errorf("create %s: %w", moveTo, err)
		}
	}
	pk := strings.Join(r.PK, ", ")
	q, qargs := r.SelectOldest(limit)
	rows, err := db.QueryxContext(ctx, d.Rebind(q), qargs...)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("select %s: %w", r.Table, err)
	}
	keys, err := scanKeys(rows)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("select %s: %w", r.Table, err)
	}
	if len(keys) == 0 {
		return 0, 0, 0, nil
	}
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return 0, 0, len(keys), fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	in, args := keyIn(r.PK, keys)
	rows, err = tx.QueryxContext(ctx, d.Rebind("SELECT "+pk+" FROM "+r.Table+" WHERE "+in+" AND "+r.Where+" FOR UPDATE"),
		append(args, r.Args...)...)
	if err != nil {
		return 0, 0, len(keys), fmt.Errorf("lock %s: %w", r.Table, err)
	}
	locked, err := scanKeys(rows)
	if err != nil {
		return 0, 0, len(keys), fmt.Errorf("lock %s: %w", r.Table, err)
	}
	if len(locked) == 0 {
		return 0, 0, len(keys), tx.Commit()
	}
	in, args = keyIn(r.PK, locked)
	if moveTo != "" {
		if _, err := tx.ExecContext(ctx, d.Rebind(d.CopyReplacing(moveTo, r.Table, in, pk)), args...); err != nil {
			return 0, 0, len(keys), fmt.Errorf("copy to %s: %w", moveTo, err)
		}
		moved = int64(len(locked))
	}
	res, err := tx.ExecContext(ctx, d.Rebind("DELETE FROM "+r.Table+" WHERE "+in), args...)
	if err != nil {
		return 0, 0, len(keys), fmt.Errorf("delete %s: %w", r.Table, err)
	}
	removed, _ = res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, 0, len(keys), fmt.Errorf("commit %s: %w", r.Table, err)
	}
	return removed, moved, len(keys), nil
}

// keyIn renders "(pk...) IN ((?, ?), ...)" for keys.
func keyIn(pk []string, keys [][]any) (string, []any) {
	tuple := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(pk)), ", ") + ")"
	var args []any
	for _, k := range keys {
		args = append(args, k...)
	}
	return "(" + strings.Join(pk, ", ") + ") IN (" + strings.TrimSuffix(strings.Repeat(tuple+", ", len(keys)), ", ") + ")", args
}

// scanKeys reads primary-key tuples, turning byte slices into strings so they
// bind back as text.
func scanKeys(rows *sqlx.Rows) ([][]any, error) {
	defer rows.Close()
	var keys [][]any
	for rows.Next() {
		k, err := rows.SliceScan()
		if err != nil {
			return nil, err
		}
		for i, v := range k {
			if b, ok := v.([]byte); ok {
				k[i] = string(b)
			}
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}
