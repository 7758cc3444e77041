package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	rmq "github.com/apache/rocketmq-client-go/v2/consumer"

	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/metrics"
)

// DefaultBatchTxSize is Config.BatchSize when Config.BatchTransaction is set
// and BatchSize is not.
const DefaultBatchTxSize = 16

// Batch mode (Config.BatchTransaction, Processor.ProcessBatch): the events
// of one delivered batch (one queue, up to BatchSize) share one database
// transaction, in delivery order:
//
//	BEGIN
//	INSERT IGNORE the dedup rows of all of them (one statement)
//	per event: version guard; handler; (result ref; attempts)
//	COMMIT, then ACK
//
// When an event fails, that pass is rolled back and the others run again in
// a new transaction, each inside its own SAVEPOINT:
//
//	BEGIN; INSERT IGNORE the dedup rows of the others
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
// statement, in a new transaction.
//
// Before the transaction every message goes through the same checks as
// Process (decoding, adoption, payload hash, route, Validate), and the
// dedup cache answers the redeliveries it knows. A second copy of an event
// in the same batch is processed alone after the commit (a dedup hit, or an
// apply if the first copy failed).

// resultBatched is the placeholder outcome of an event that Process handed
// to a batch (never returned to callers).
const resultBatched Result = "batched"

// batchKey is the context key of the collector ProcessBatch passes through
// Process: apply then collects the event instead of applying it.
type batchKey struct{}

type batchCollector struct {
	cur   int // index of the message Process is checking
	items []batchItem
}

type batchItem struct {
	idx   int
	m     Message
	ev    Event
	route Route
}

// collect is apply's hook: inside ProcessBatch, an event that passed every
// check is collected for the shared transaction.
func collect(ctx context.Context, m Message, ev Event, route Route) (Outcome, bool) {
	bc, ok := ctx.Value(batchKey{}).(*batchCollector)
	if !ok {
		return Outcome{}, false
	}
	bc.items = append(bc.items, batchItem{idx: bc.cur, m: m, ev: ev, route: route})
	return Outcome{Result: resultBatched, EventID: ev.ID}, true
}

// ProcessBatch handles the messages of one delivered batch (one queue, in
// queue order) with one database transaction for all of them (see the batch
// mode comment above) and returns one outcome per message, in order. As
// with Process, a message may be ACKed only when its outcome's Ack() is
// true; by then everything is committed. ProcessTimeout bounds the whole
// batch.
func (p *Processor) ProcessBatch(ctx context.Context, msgs []Message) []Outcome {
	outs := make([]Outcome, len(msgs))
	bc := &batchCollector{}
	cctx := context.WithValue(ctx, batchKey{}, bc)
	for i, m := range msgs {
		bc.cur = i
		outs[i] = p.Process(cctx, m)
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ProcessTimeout)
	defer cancel()
	var run []batchItem
	var later []int
	seen := map[string]bool{}
	for _, it := range bc.items {
		switch {
		case p.cache.hit(it.ev.ID, it.ev.PayloadHash):
			outs[it.idx] = p.duplicate(ctx, it.ev)
		case seen[it.ev.ID]:
			later = append(later, it.idx)
		default:
			seen[it.ev.ID] = true
			run = append(run, it)
		}
	}
	switch len(run) {
	case 0:
	case 1:
		outs[run[0].idx] = p.apply(ctx, run[0].m, run[0].ev, run[0].route)
	default:
		p.applyBatch(ctx, run, outs)
	}
	for _, i := range later {
		outs[i] = p.Process(ctx, msgs[i])
	}
	return outs
}

// batchState is what the shared transaction decided for one event.
type batchState int

const (
	bsNew       batchState = iota // dedup row inserted by this transaction
	bsDuplicate                   // dedup row existed (hash in existing)
	bsApplied                     // handler ran, effect in the transaction
	bsStale                       // older version, marked stale in the transaction
	bsFailed                      // rolled back to its savepoint; class and err say why
)

type batchEvent struct {
	batchItem
	state    batchState
	existing string // stored hash (bsDuplicate)
	class    Class  // bsFailed
	err      error  // bsFailed
	gap      bool   // bsFailed by a strict version gap
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
func (p *Processor) applyBatch(ctx context.Context, items []batchItem, outs []Outcome) {
	evs := make([]*batchEvent, len(items))
	for i, it := range items {
		evs[i] = &batchEvent{batchItem: it}
	}
	k, err := p.runBatchTx(ctx, evs, p.batchQueries.savepointsAlways)
	if err == nil && k >= 0 {
		rest := make([]*batchEvent, 0, len(evs)-1)
		for i, e := range evs {
			if i != k {
				*e = batchEvent{batchItem: e.batchItem}
				rest = append(rest, e)
			}
		}
		_, err = p.runBatchTx(ctx, rest, true)
		if err != nil {
			outs[evs[k].idx] = p.fail(ctx, evs[k].m, evs[k].ev, evs[k].class, evs[k].err)
			evs = rest
		}
	}
	if err != nil {
		// Nothing of the batch is committed: every event is a failed
		// attempt of its own (retried, or parked at its limit).
		for _, e := range evs {
			outs[e.idx] = p.fail(ctx, e.m, e.ev, ClassTransient, err)
		}
		return
	}
	g := p.cfg.Group
	for _, e := range evs {
		ev := e.ev
		switch e.state {
		case bsApplied:
			p.failed.remove(ev.ID)
			p.cache.add(ev.ID, ev.PayloadHash)
			p.stats.applied.Add(1)
			p.count(ev, ResultApplied)
			if p.cfg.Metrics != nil && !ev.Delivery.StoredAt.IsZero() {
				p.cfg.Metrics.ConsumerLag.WithLabelValues(g).Observe(time.Since(ev.Delivery.StoredAt).Seconds())
			}
			outs[e.idx] = Outcome{Result: ResultApplied, EventID: ev.ID}
		case bsStale:
			p.failed.remove(ev.ID)
			p.cache.add(ev.ID, ev.PayloadHash)
			p.stats.stale.Add(1)
			metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerStale }, g, p.typeLabel(ev))
			p.count(ev, ResultStale)
			outs[e.idx] = Outcome{Result: ResultStale, EventID: ev.ID}
		case bsDuplicate:
			if e.existing == ev.PayloadHash {
				p.cache.add(ev.ID, e.existing)
				outs[e.idx] = p.duplicate(ctx, ev)
				continue
			}
			err := fmt.Errorf("%w: event %s applied with payload hash %s, redelivered with %s", ErrConflict, ev.ID, e.existing, ev.PayloadHash)
			outs[e.idx] = p.park(ctx, e.m, ev, ClassConflict, err, e.existing, 0)
		case bsFailed:
			if e.gap {
				p.stats.gaps.Add(1)
				metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerGaps }, g, p.typeLabel(ev))
			}
			outs[e.idx] = p.fail(ctx, e.m, ev, e.class, e.err)
		}
	}
}

// runBatchTx is one pass of the shared transaction over evs. With
// savepoints, every event runs in its own savepoint and a failing one is
// rolled back alone; the pass commits. Without, the first failing event
// ends the pass: everything is rolled back and its index returned (its
// state says why). err is set when nothing could be committed for a reason
// that is not one event's (the database, a lost transaction, the commit).
func (p *Processor) runBatchTx(ctx context.Context, evs []*batchEvent, savepoints bool) (failed int, err error) {
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return -1, fmt.Errorf("consumer: begin: %w", err)
	}
	defer func() {
		if tx != nil {
			_ = tx.Rollback() // a no-op after the commit
		}
	}()
	// 1. The dedup rows, all in one statement.
	if tx, err = p.batchDedup(ctx, tx, evs); err != nil {
		return -1, err
	}
	// 2. Per event, in order: guard and handler.
	for i, e := range evs {
		if e.state != bsNew {
			continue
		}
		if err := p.batchApplyOne(ctx, tx, e, savepoints); err != nil {
			// The transaction itself is gone (a deadlock rolls it back
			// whole): nothing of the batch is committed.
			return -1, err
		}
		if e.state == bsFailed && !savepoints {
			return i, nil
		}
	}
	// 3. Commit. A commit error is ambiguous; the redeliveries find out
	// (dedup hits if it did commit).
	if err := tx.Commit(); err != nil {
		return -1, fmt.Errorf("consumer: commit: %w", err)
	}
	failpoint.Inject(failpoint.AfterConsumeCommit)
	return -1, nil
}

// batchDedup inserts the dedup rows of evs with one INSERT IGNORE and marks
// each event new or duplicate. All inserted: all new. None inserted: all
// existed, and one locking read returns their hashes. Some: which ones is
// not known from the statement, so the transaction starts over and decides
// per event with single mode's statement. It returns the transaction to go
// on with.
func (p *Processor) batchDedup(ctx context.Context, tx *sqlx.Tx, evs []*batchEvent) (*sqlx.Tx, error) {
	g := p.cfg.Group
	args := make([]any, 0, 5*len(evs))
	ids := make([]any, 0, len(evs)+1)
	ids = append(ids, g)
	for _, e := range evs {
		args = append(args, g, e.ev.ID, e.ev.Type, e.ev.PayloadHash, e.ev.Delivery.ReconsumeTimes)
		ids = append(ids, e.ev.ID)
	}
	res, err := p.stmts.TxExec(ctx, tx, p.batchQueries.insert(p.t.log, len(evs)), args...)
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
			e.state = bsNew
			p.dups.record(false)
		}
		return tx, nil
	case n == 0:
		var rows []struct {
			ID   string `db:"event_id"`
			Hash string `db:"request_hash"`
		}
		if err := p.stmts.TxSelect(ctx, tx, &rows, p.batchQueries.hashes(p.t.log, len(evs)), ids...); err != nil {
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
			e.state, e.existing = bsDuplicate, h
			p.dups.record(true)
		}
		return tx, nil
	}
	// Mixed: start over and decide one by one.
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return nil, fmt.Errorf("consumer: rollback: %w", err)
	}
	tx, err = p.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("consumer: begin: %w", err)
	}
	for _, e := range evs {
		res, err := p.stmts.TxExec(ctx, tx, p.q.insertLog, g, e.ev.ID, e.ev.Type, e.ev.PayloadHash, e.ev.Delivery.ReconsumeTimes, e.ev.PayloadHash)
		if err != nil {
			return tx, fmt.Errorf("consumer: insert consume log: %w", err)
		}
		dup, existing, err := p.dedupResult(ctx, tx, res, e.ev)
		if err != nil {
			return tx, err
		}
		p.dups.record(dup)
		if dup {
			e.state, e.existing = bsDuplicate, existing
		} else {
			e.state = bsNew
		}
	}
	return tx, nil
}

// batchApplyOne runs one new event: guard, handler, result ref, attempts.
// With savepoint it runs inside its own savepoint, and a failure rolls back
// to it and deletes the event's dedup row; without, a failure is only
// recorded (the caller rolls the pass back). The event's state says what
// happened; an error is returned only when the transaction itself is lost.
func (p *Processor) batchApplyOne(ctx context.Context, tx *sqlx.Tx, e *batchEvent, savepoint bool) error {
	if savepoint {
		if _, err := tx.ExecContext(ctx, "SAVEPOINT "+savepointName); err != nil {
			return fmt.Errorf("consumer: savepoint: %w", err)
		}
	}
	fail := func(c Class, err error) error {
		if savepoint {
			if _, rerr := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepointName); rerr != nil {
				return fmt.Errorf("consumer: rollback to savepoint after %w: %w", err, rerr)
			}
			if _, derr := p.stmts.TxExec(ctx, tx, p.batchQueries.deleteLog(p.t.log), p.cfg.Group, e.ev.ID); derr != nil {
				return fmt.Errorf("consumer: remove the dedup row after %w: %w", err, derr)
			}
		}
		e.state, e.class, e.err = bsFailed, c, err
		return nil
	}
	ev := e.ev
	mode := e.route.Version
	if mode == VersionInherit {
		mode = p.cfg.VersionMode
	}
	if mode != VersionNone && ev.AggregateType != "" && ev.AggregateVersion > 0 {
		v, err := p.guard(ctx, tx, ev, mode)
		if err != nil {
			return fail(ClassTransient, err)
		}
		switch v {
		case verdictStale:
			if _, err := p.stmts.TxExec(ctx, tx, p.q.markStale, p.cfg.Group, ev.ID); err != nil {
				return fail(ClassTransient, fmt.Errorf("consumer: mark stale: %w", err))
			}
			if err := p.clearAttemptsTx(ctx, tx, ev); err != nil {
				return fail(ClassTransient, err)
			}
			e.state = bsStale
			return nil
		case verdictGap:
			e.gap = true
			return fail(ClassWait, fmt.Errorf("%w: %s/%s version %d", ErrVersionGap, ev.AggregateType, ev.AggregateID, ev.AggregateVersion))
		}
	}
	ref := &resultRef{}
	if err := callHandler(context.WithValue(ctx, resultRefKey{}, ref), e.route.Handler, tx, ev); err != nil {
		return fail(ClassOf(err), err)
	}
	if ref.ref != "" {
		if _, err := p.stmts.TxExec(ctx, tx, p.q.setResultRef, ref.ref, p.cfg.Group, ev.ID); err != nil {
			return fail(ClassTransient, fmt.Errorf("consumer: set result ref: %w", err))
		}
	}
	if err := p.clearAttemptsTx(ctx, tx, ev); err != nil {
		return fail(ClassTransient, err)
	}
	e.state = bsApplied
	return nil
}

// batchSQL builds (and keeps) the batch statements per batch size: a few
// texts, each prepared once (package stmtcache).
type batchSQL struct {
	mu sync.Mutex
	m  map[string]string
	// savepointsAlways makes the first pass take a savepoint per event too
	// (for tests and measurements that compare the two).
	savepointsAlways bool
}

func (b *batchSQL) get(key string, build func() string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]string{}
	}
	q, ok := b.m[key]
	if !ok {
		q = build()
		b.m[key] = q
	}
	return q
}

// insert is the multi-row dedup insert for n events. IGNORE counts only the
// rows it inserted, whatever clientFoundRows says.
func (b *batchSQL) insert(table string, n int) string {
	return b.get(fmt.Sprintf("insert/%d", n), func() string {
		row := "(?, ?, ?, ?, '" + StatusApplied + "', ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
		return "INSERT IGNORE INTO " + table + " (consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at) VALUES " +
			strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
	})
}

// hashes reads the stored hashes of n events with a locking read: inside
// the transaction that holds their rows' locks it returns the committed
// rows whatever the isolation level.
func (b *batchSQL) hashes(table string, n int) string {
	return b.get(fmt.Sprintf("hashes/%d", n), func() string {
		return "SELECT event_id, request_hash FROM " + table + " WHERE consumer_group = ? AND event_id IN (" +
			strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ") LOCK IN SHARE MODE"
	})
}

// deleteLog removes a failed event's dedup row inserted by this transaction.
func (b *batchSQL) deleteLog(table string) string {
	return b.get("delete", func() string {
		return "DELETE FROM " + table + " WHERE consumer_group = ? AND event_id = ?"
	})
}

// consumeTxBatch is onMessages in batch mode: one ProcessBatch for the
// delivered messages, then the ACK (or the re-sends of the ones to retry) as
// consumeBatch does.
func consumeTxBatch(ctx context.Context, p *Processor, rs resender, msgs []*primitive.MessageExt) (rmq.ConsumeResult, error) {
	in := make([]Message, len(msgs))
	for i, m := range msgs {
		in[i] = MessageFromExt(m)
	}
	return settle(ctx, rs, msgs, p.ProcessBatch(ctx, in))
}
