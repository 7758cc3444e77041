package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// DefaultBatchTxSize is Config.BatchSize when Config.BatchTransaction is set
// and BatchSize is not.
const DefaultBatchTxSize = 16

// Batch mode (Config.BatchTransaction, Processor.ProcessBatch): the events
// of one delivered batch (one queue, up to BatchSize) share one database
// transaction, in delivery order:
//
//	count the attempts of all of them (crash counting, crash.go: one statement)
//	BEGIN
//	insert the dedup rows of all of them, skipping existing ones (one statement)
//	per event: version guard; handler; (result ref)
//	delete the attempt rows of those that have one (one statement)
//	COMMIT, then ACK
//
// When an event fails, that pass is rolled back and the others run again in
// a new transaction, each inside its own SAVEPOINT:
//
//	BEGIN; insert the dedup rows of the others
//	per event: SAVEPOINT; guard; handler
//	           a failure: ROLLBACK TO SAVEPOINT and DELETE its dedup row
//	COMMIT, then ACK
//
// A failing event rolls back only itself and is retried or parked alone
// (after the commit, as in single mode); its neighbours commit. The first
// pass goes without savepoints because a SAVEPOINT is a statement and a
// round trip per event, which batches that succeed (nearly all) would pay
// for nothing (see applyBatch and BENCHMARKS.md). The version guard runs per
// event in order, so two versions of one aggregate in one batch apply in
// order, and a version after a failed one waits (a gap).
// What the statement cannot decide exactly - a batch that mixes new events
// and ones already applied - is decided per event with single mode's dedup
// step, in a new transaction.
//
// The steps are single mode's (txsteps.go): every message goes through
// check first, and the dedup cache answers the redeliveries it knows; in
// the transaction each event runs eventSteps (guard, handler); after it,
// result turns each event's decision into its outcome. A second copy of an
// event in the same batch is processed alone after the commit (a dedup hit,
// or an apply if the first copy failed).

// ProcessBatch handles the messages of one delivered batch (one queue, in
// queue order) with one database transaction for all of them (see the batch
// mode comment above) and returns one outcome per message, in order. As
// with Process, a message may be ACKed only when its outcome's Ack() is
// true; by then everything is committed. ProcessTimeout bounds the whole
// batch.
func (p *Processor) ProcessBatch(ctx context.Context, msgs []Message) []Outcome {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ProcessTimeout)
	defer cancel()
	outs := make([]Outcome, len(msgs))
	var run []item
	var later []int
	seen := map[string]bool{}
	for i, m := range msgs {
		it, out, ok := p.check(ctx, m)
		switch {
		case !ok:
			outs[i] = out
		case p.cache.hit(it.ev.ID, it.ev.PayloadHash):
			outs[i] = p.duplicate(ctx, it.ev)
		case seen[it.ev.ID]:
			later = append(later, i)
		default:
			seen[it.ev.ID] = true
			it.idx = i
			run = append(run, it)
		}
	}
	// Crash counting (crash.go): the events no other copy runs in this
	// process, counted together; the claims last until their outcomes are
	// recorded.
	var claimed []string
	if p.counting() {
		count := make([]*item, 0, len(run))
		for i := range run {
			if p.running.claim(run[i].ev.ID) {
				claimed = append(claimed, run[i].ev.ID)
				if !p.covered(ctx, run[i].ev) {
					count = append(count, &run[i]) // a suspect of its queue's window
				}
			}
		}
		p.countBatch(ctx, count)
	}
	kept := run[:0]
	for _, it := range run {
		if it.crashed {
			// Its last attempt ended the process: it runs alone (or is
			// parked), so it cannot take its neighbours down again.
			outs[it.idx] = p.apply(ctx, it)
			continue
		}
		kept = append(kept, it)
	}
	run = kept
	switch len(run) {
	case 0:
	case 1:
		outs[run[0].idx] = p.apply(ctx, run[0])
	default:
		p.applyBatch(ctx, run, outs)
	}
	p.running.release(claimed...)
	for _, i := range later {
		outs[i] = p.Process(ctx, msgs[i])
	}
	return outs
}

// batchEvent is one event of the shared transaction and what it decided.
type batchEvent struct {
	item
	decision
}

const savepointName = "rmqtx_event"

// applyBatch runs the shared transaction for items (distinct event ids,
// none known to the cache) and sets their outcomes.
//
// The first pass runs every event without a savepoint: a SAVEPOINT is one
// more statement and round trip per event, about a third of what a batched
// event costs the database otherwise. When an event fails, the pass is
// rolled back whole and a second pass runs the other events, each inside
// its own SAVEPOINT; the failed event is not run again in it (its failure is
// recorded as in single mode), and any event failing in the second pass
// rolls back to its savepoint alone. So a failing event never takes its
// neighbours with it; they commit in the second pass.
func (p *Processor) applyBatch(ctx context.Context, items []item, outs []Outcome) {
	evs := make([]*batchEvent, len(items))
	for i, it := range items {
		it.batch = true
		evs[i] = &batchEvent{item: it}
	}
	k, err := p.runBatchTx(ctx, evs, p.batchQueries.savepointsAlways)
	if err == nil && k >= 0 {
		first := evs[k]
		rest := make([]*batchEvent, 0, len(evs)-1)
		for i, e := range evs {
			if i != k {
				e.decision = decision{}
				rest = append(rest, e)
			}
		}
		if _, err = p.runBatchTx(ctx, rest, true); err != nil {
			outs[first.idx] = p.result(ctx, first.item, first.decision)
			evs = rest
		}
	}
	for _, e := range evs {
		if err != nil {
			// Nothing of the batch is committed: every event is a failed
			// attempt of its own (retried, or parked at its limit).
			e.decision = failed(ClassTransient, err)
		}
		outs[e.idx] = p.result(ctx, e.item, e.decision)
	}
}

// runBatchTx is one pass of the shared transaction over evs. With
// savepoints, every event runs in its own savepoint and a failing one is
// rolled back alone; the pass commits. Without, the first failing event
// ends the pass: everything is rolled back and its index returned (its
// decision says why). err is set when nothing could be committed for a
// reason that is not one event's (the database, a lost transaction, the
// commit).
func (p *Processor) runBatchTx(ctx context.Context, evs []*batchEvent, savepoints bool) (failedAt int, err error) {
	// 1. The dedup rows, all in one statement; a deadlock there is run
	// again at once, as in single mode (dedupAgain).
	var tx *sqlx.Tx
	for try := 1; ; try++ {
		if tx, err = p.begin(ctx); err != nil {
			return -1, err
		}
		if tx, err = p.batchDedup(ctx, tx, evs); err == nil {
			break
		}
		if tx != nil {
			_ = tx.Rollback()
		}
		if !p.dedupAgain(err, try) {
			return -1, err
		}
	}
	defer func() { _ = tx.Rollback() }() // a no-op after the commit
	// 2. Per event, in order: guard and handler.
	for i, e := range evs {
		if e.state != evNew {
			continue
		}
		if err := p.batchEventSteps(ctx, tx, e, savepoints); err != nil {
			// The transaction itself is gone (a deadlock rolls it back
			// whole): nothing of the batch is committed.
			return -1, err
		}
		if e.state == evFailed && !savepoints {
			return i, nil
		}
	}
	// 3. The attempt rows of the events it applies, all in one statement.
	cleared, err := p.clearBatchAttempts(ctx, tx, evs)
	if err != nil {
		return -1, err
	}
	// 4. Commit. A commit error is ambiguous; the redeliveries find out
	// (dedup hits if it did commit).
	if err := p.commit(tx); err != nil {
		return -1, err
	}
	for _, e := range cleared {
		e.ev.cleared = true
	}
	return -1, nil
}

// clearBatchAttempts deletes, in the batch's transaction and with one
// statement, the attempt rows of the events of evs that may have one and
// that the transaction commits as applied, stale or a dedup hit with their
// own hash: their failures' (and counts') bookkeeping goes with the commit,
// atomically, as clearAttemptsTx does for one event. It returns those
// events, to be marked cleared once the commit succeeded. The rows are
// deleted in event id order, the order the batch count locks them in.
func (p *Processor) clearBatchAttempts(ctx context.Context, tx *sqlx.Tx, evs []*batchEvent) ([]*batchEvent, error) {
	var clear []*batchEvent
	for _, e := range evs {
		switch {
		case !p.mayHaveAttempts(e.ev):
		case e.state == evApplied, e.state == evStale,
			e.state == evDuplicate && e.existing == e.ev.PayloadHash:
			clear = append(clear, e)
		}
	}
	if len(clear) == 0 {
		return nil, nil
	}
	ids := make([]string, len(clear))
	for i, e := range clear {
		ids[i] = e.ev.ID
	}
	slices.Sort(ids)
	args := make([]any, 0, len(ids)+1)
	args = append(args, p.cfg.Group)
	for _, id := range ids {
		args = append(args, id)
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.batchQueries.deleteAttempts(len(ids)), args...); err != nil {
		return nil, fmt.Errorf("consumer: clear attempts: %w", err)
	}
	return clear, nil
}

// batchDedup inserts the dedup rows of evs with one statement that skips
// existing rows and marks each event new or duplicate. All inserted: all
// new. None inserted: all existed, and one locking read returns their
// hashes. Some: which ones is not known from the statement, so the
// transaction starts over and decides per event with single mode's dedup
// step. It returns the transaction to go on with.
func (p *Processor) batchDedup(ctx context.Context, tx *sqlx.Tx, evs []*batchEvent) (*sqlx.Tx, error) {
	g := p.cfg.Group
	args := make([]any, 0, 5*len(evs))
	ids := make([]any, 0, len(evs)+1)
	ids = append(ids, g)
	for _, e := range evs {
		args = append(args, g, e.ev.ID, e.ev.Type, e.ev.PayloadHash, e.ev.Delivery.ReconsumeTimes)
		ids = append(ids, e.ev.ID)
	}
	res, err := p.stmts.TxExec(ctx, tx, p.batchQueries.insert(len(evs)), args...)
	if err != nil {
		return tx, fmt.Errorf("consumer: insert consume log: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return tx, fmt.Errorf("consumer: insert consume log: %w", err)
	}
	switch {
	case n == int64(len(evs)):
		for _, e := range evs {
			e.decision = decision{state: evNew}
			p.dups.record(false)
		}
		return tx, nil
	case n == 0:
		var rows []struct {
			ID   string `db:"event_id"`
			Hash string `db:"request_hash"`
		}
		if err := p.stmts.TxSelect(ctx, tx, &rows, p.batchQueries.hashes(len(evs)), ids...); err != nil {
			return tx, fmt.Errorf("consumer: read consume log: %w", err)
		}
		hash := make(map[string]string, len(rows))
		for _, r := range rows {
			hash[r.ID] = r.Hash
		}
		for _, e := range evs {
			h, ok := hash[e.ev.ID]
			if !ok {
				return tx, fmt.Errorf("consumer: read consume log: no row for %s", e.ev.ID)
			}
			e.decision = decision{state: evDuplicate, existing: h}
			p.dups.record(true)
		}
		return tx, nil
	}
	// Mixed: start over and decide one by one.
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return nil, fmt.Errorf("consumer: rollback: %w", err)
	}
	if tx, err = p.begin(ctx); err != nil {
		return nil, err
	}
	for _, e := range evs {
		if e.decision, err = p.dedupStep(ctx, tx, e.ev); err != nil {
			return tx, err
		}
	}
	return tx, nil
}

// batchEventSteps runs eventSteps for one new event of the batch. With
// savepoint it runs inside its own savepoint, and a failure rolls back to
// it and deletes the event's dedup row; without, a failure is only
// recorded (the caller rolls the pass back). The event's decision says what
// happened; an error is returned only when the transaction itself is lost.
func (p *Processor) batchEventSteps(ctx context.Context, tx *sqlx.Tx, e *batchEvent, savepoint bool) error {
	if savepoint {
		if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepointName); err != nil {
			return fmt.Errorf("consumer: savepoint: %w", err)
		}
	}
	e.decision = p.eventSteps(ctx, tx, e.item)
	if e.state != evFailed || !savepoint {
		return nil
	}
	if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepointName); err != nil {
		return fmt.Errorf("consumer: rollback to savepoint after %w: %w", e.err, err)
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.batchQueries.deleteLog(), p.cfg.Group, e.ev.ID); err != nil {
		return fmt.Errorf("consumer: remove the dedup row after %w: %w", e.err, err)
	}
	return nil
}

// batchSQL builds (and keeps) the batch statements per batch size: a few
// texts, each prepared once (package stmtcache).
type batchSQL struct {
	d       dialect.Dialect
	log     string // the consume log's table
	attempt string // the attempt table (crash counting, crash.go)
	mu      sync.Mutex
	m       map[string]string
	// savepointsAlways makes the first pass take a savepoint per event too
	// (for tests and measurements that compare the two).
	savepointsAlways bool
}

// get returns the statement key names, building it (and rebinding it)
// the first time.
func (b *batchSQL) get(key string, build func() string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]string{}
	}
	q, ok := b.m[key]
	if !ok {
		q = b.d.Rebind(build())
		b.m[key] = q
	}
	return q
}

// insert is the multi-row dedup insert for n events. Skipping existing rows,
// it counts only the rows it inserted, whatever the driver's found-rows
// flag says.
func (b *batchSQL) insert(n int) string {
	return b.get(fmt.Sprintf("insert/%d", n), func() string {
		row := "(?, ?, ?, ?, '" + StatusApplied + "', ?, " + b.d.Now() + ", " + b.d.Now() + ")"
		return b.d.InsertIgnore(b.log, "consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at",
			strings.TrimSuffix(strings.Repeat(row+", ", n), ", "), "consumer_group, event_id")
	})
}

// hashes reads the stored hashes of n events with a locking read: inside
// the transaction that holds their rows' locks it returns the committed
// rows whatever the isolation level.
func (b *batchSQL) hashes(n int) string {
	return b.get(fmt.Sprintf("hashes/%d", n), func() string {
		return "SELECT event_id, request_hash FROM " + b.log + " WHERE consumer_group = ? AND event_id IN (" +
			strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ") " + b.d.SharedLock()
	})
}

// deleteAttempts removes the attempt rows of n events (clearBatchAttempts).
func (b *batchSQL) deleteAttempts(n int) string {
	return b.get(fmt.Sprintf("attempts/%d", n), func() string {
		return "DELETE FROM " + b.attempt + " WHERE consumer_group = ? AND event_id IN (" +
			strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")"
	})
}

// deleteLog removes a failed event's dedup row inserted by this transaction.
func (b *batchSQL) deleteLog() string {
	return b.get("delete", func() string {
		return "DELETE FROM " + b.log + " WHERE consumer_group = ? AND event_id = ?"
	})
}
