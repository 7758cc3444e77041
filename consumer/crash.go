package consumer

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// Crash counting: a handler that ends its process (a crash, os.Exit, an
// OOM kill, a SIGKILL) returns no error, so nothing is counted after it, and
// its message comes back from the queue's committed offset looking like a
// first delivery (ReconsumeTimes 0). Without a count taken BEFORE the
// handler runs, such a poison message would be redelivered and kill every
// process it reaches, forever.
//
// So, unless ProcessorConfig.NoCrashCount, a delivery that takes the
// database path and may follow such a crash counts its attempt in the
// consume_attempt table in its own autocommitted statement before its
// transaction begins (countAttempt). Which deliveries may follow a crash is
// what the crash-count windows decide (window.go): a first delivery past
// the window its process committed is not counted. The row is marked
// last_class = 'crash' while the attempt runs:
//
//	success, stale, dedup hit  the row is deleted (in the success's transaction)
//	failure                    fail records the class and error over the mark,
//	                           without counting again (recordCounted)
//	the process ends           the mark stays
//
// The next count of the event sees the mark still there (the same statement
// turns it into the crash text in last_error and returns whether it did),
// so it knows the previous attempt crashed. When the attempts before this
// one exceed MaxRetries and the last of them crashed, the event is parked
// with class ClassCrash (after its dedup step, so an event whose effect did
// commit is a dedup hit, never parked) instead of running its handler
// again. A crash is a failure of unknown outcome, so it is bounded by
// MaxRetries, like an Unknown failure.
//
// Before BEGIN, not inside the transaction: a second connection taken while
// the transaction holds one could wait forever on a pool of one.
//
// Overlapping copies. A copy of an event delivered while another copy of it
// runs in this process (a duplicate storm, a redelivery during a slow
// handler) would see the running copy's mark and count it as a crash; more
// than MaxRetries such copies would park a healthy event as a crash while
// its first copy commits, and each would wait on the row lock of the
// running transaction's DELETE. So the processor keeps the ids whose
// counted attempt is under way in this process (running, claimed before
// the count and released once the attempt's outcome is recorded); a copy
// whose id is claimed does not count and does not touch the attempt row: it
// goes on to the dedup step, which waits for the running copy's
// transaction and is a dedup hit when it commits. When the running copy
// fails instead, the copy that then inserts the dedup row runs its handler
// uncounted (a crash of that run is not counted; the next delivery counts
// again). Copies that overlap across instances (processes) still count,
// each once: such a copy may take the other instance's running attempt for
// a crash, so parking a healthy event that way needs more than MaxRetries
// copies delivered to other instances while one attempt runs.
//
// Batch mode (ProcessBatch) counts the events of a batch together, in a
// constant number of statements whatever its size: one multi-row count
// before BEGIN (countBatch), one read of the events whose previous attempt
// crashed (skipped on MySQL when the count inserted every row; PostgreSQL
// returns them from the count itself), and one multi-row DELETE of the
// attempt rows of the events the batch applies, in the batch's transaction
// (clearBatchAttempts, batch.go).

// crashText is what a counted attempt that crashed leaves in last_error. It
// is a constant (no data) and names no column (the PostgreSQL dialect
// qualifies column names outside literals only, but a reader should not
// wonder).
const crashText = "consumer: the process ended while the handler ran"

// countAttemptSQL counts an attempt before its handler runs: a new row
// (attempts 1, marked crash), or the existing row with attempts + 1, its
// crash mark turned into crashText when the previous attempt left it there,
// and marked again. It returns attempts * 2 + 1 when the previous attempt
// crashed, attempts * 2 otherwise. last_error is assigned before last_class:
// MySQL applies the assignments left to right, PostgreSQL reads the old row
// on every right-hand side; both see the old last_class there.
func countAttemptSQL(d dialect.Dialect, table string) string {
	crash := "'" + string(ClassCrash) + "'"
	return d.UpsertReturning(table,
		"consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at",
		"?, ?, 1, "+crash+", '', "+d.Now()+", "+d.Now(), "consumer_group, event_id",
		"attempts = attempts + 1, last_error = CASE WHEN last_class = "+crash+" THEN '"+crashText+"' ELSE last_error END, "+
			"last_class = "+crash+", updated_at = "+d.Now(),
		"attempts * 2 + CASE WHEN last_error = '"+crashText+"' AND last_class = "+crash+" THEN 1 ELSE 0 END")
}

// counting reports whether the processor counts attempts before handlers.
func (p *Processor) counting() bool { return !p.cfg.NoCrashCount }

// countAttempt counts it.ev's attempt before its handler runs. It marks it.ev
// counted (its attempt row exists: the success deletes it, a failure
// records over it) and it.crashes when the previous attempt crashed;
// it.crashPark when, besides, the attempts before this one exceed
// MaxRetries: the event is then parked as a crash, not run. An error is
// logged and leaves the event uncounted (a failure then counts as before).
func (p *Processor) countAttempt(ctx context.Context, it *item) {
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	inserted, v, err := p.d.ExecReturning(bctx, cached{c: p.stmts}, p.q.countAttempt, p.cfg.Group, it.ev.ID)
	if err != nil {
		p.cfg.Logger.WithFields(p.fields(it.ev)).WithError(err).Warn("consumer: cannot count an attempt before its handler")
		return
	}
	it.ev.counted = true
	if inserted || v%2 == 0 {
		return
	}
	it.attempts = int(v / 2)
	it.crashed = true
	it.crashPark = it.attempts-1 > p.cfg.MaxRetries
	p.cfg.Logger.WithFields(p.fields(it.ev)).WithField("attempt", it.attempts).WithField("parked", it.crashPark).
		Warn("consumer: the previous attempt of this event ended its process while the handler ran")
}

// countBatch counts the attempts of its, the events of one batch whose ids
// this processor claimed, like countAttempt but in one statement (and, on
// MySQL, one read of the crashed ones when some rows existed). The rows
// are counted in event id order, so two batches that share events lock
// their rows in the same order. An error is logged and leaves every event
// uncounted.
func (p *Processor) countBatch(ctx context.Context, its []*item) {
	switch len(its) {
	case 0:
		return
	case 1:
		p.countAttempt(ctx, its[0])
		return
	}
	its = slices.Clone(its)
	slices.SortFunc(its, func(a, b *item) int { return strings.Compare(a.ev.ID, b.ev.ID) })
	n := len(its)
	args := make([]any, 0, 2*n)
	for _, it := range its {
		args = append(args, p.cfg.Group, it.ev.ID)
	}
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	crashed, err := p.countBatchRows(bctx, n, args)
	if err != nil {
		p.cfg.Logger.WithField("consumer_group", p.cfg.Group).WithField("events", n).WithError(err).
			Warn("consumer: cannot count the attempts of a batch before its handlers")
		return
	}
	for _, it := range its {
		it.ev.counted = true
		attempts, ok := crashed[it.ev.ID]
		if !ok {
			continue
		}
		it.attempts = attempts
		it.crashed = true
		it.crashPark = it.attempts-1 > p.cfg.MaxRetries
		p.cfg.Logger.WithFields(p.fields(it.ev)).WithField("attempt", it.attempts).WithField("parked", it.crashPark).
			Warn("consumer: the previous attempt of this event ended its process while the handler ran")
	}
}

// countBatchRows runs the batch count for n events (args: group and id per
// event) and returns the attempts, after the count, of the events whose
// previous attempt crashed.
func (p *Processor) countBatchRows(ctx context.Context, n int, args []any) (map[string]int, error) {
	crashed := map[string]int{}
	b := &p.batchQueries
	if _, returns := b.d.RowsReturning("", ""); returns {
		// PostgreSQL: the count returns every row it wrote, crashed or not.
		var rows []struct {
			ID       string `db:"event_id"`
			Attempts int    `db:"attempts"`
			Crashed  bool   `db:"crashed"`
		}
		if err := p.stmts.Select(ctx, &rows, b.countAttempts(n), args...); err != nil {
			return nil, fmt.Errorf("consumer: count attempts: %w", err)
		}
		for _, r := range rows {
			if r.Crashed {
				crashed[r.ID] = r.Attempts
			}
		}
		return crashed, nil
	}
	res, err := p.stmts.Exec(ctx, b.countAttempts(n), args...)
	if err != nil {
		return nil, fmt.Errorf("consumer: count attempts: %w", err)
	}
	affected, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("consumer: count attempts: %w", err)
	}
	if affected == int64(n) {
		// MySQL counts 1 per inserted row and 2 per updated one (the
		// count always changes attempts): every row is new, none crashed.
		return crashed, nil
	}
	var rows []struct {
		ID       string `db:"event_id"`
		Attempts int    `db:"attempts"`
	}
	ids := make([]any, 0, n+1)
	ids = append(ids, p.cfg.Group)
	for i := 1; i < len(args); i += 2 {
		ids = append(ids, args[i])
	}
	if err := p.stmts.Select(ctx, &rows, b.crashedAttempts(n), ids...); err != nil {
		return nil, fmt.Errorf("consumer: read crashed attempts: %w", err)
	}
	for _, r := range rows {
		crashed[r.ID] = r.Attempts
	}
	return crashed, nil
}

// crashedWhere is true of an attempt row, right after its count, when the
// previous attempt crashed (the count turned its mark into crashText).
const crashedWhere = "last_error = '" + crashText + "' AND last_class = '" + string(ClassCrash) + "'"

// countAttempts is countAttemptSQL for n rows in one statement. On
// PostgreSQL it returns each row's event id, attempts and whether the
// previous attempt crashed; on MySQL it returns nothing (crashedAttempts
// reads them).
func (b *batchSQL) countAttempts(n int) string {
	return b.get(fmt.Sprintf("count/%d", n), func() string {
		crash := "'" + string(ClassCrash) + "'"
		row := "(?, ?, 1, " + crash + ", '', " + b.d.Now() + ", " + b.d.Now() + ")"
		q := b.d.Upsert(b.attempt,
			"consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at",
			strings.TrimSuffix(strings.Repeat(row+", ", n), ", "), "consumer_group, event_id",
			"attempts = attempts + 1, last_error = CASE WHEN last_class = "+crash+" THEN '"+crashText+"' ELSE last_error END, "+
				"last_class = "+crash+", updated_at = "+b.d.Now())
		q, _ = b.d.RowsReturning(q, "event_id, attempts, ("+crashedWhere+") AS crashed")
		return q
	})
}

// crashedAttempts reads, among n events just counted, those whose previous
// attempt crashed, with their attempts (MySQL's second statement).
func (b *batchSQL) crashedAttempts(n int) string {
	return b.get(fmt.Sprintf("crashed/%d", n), func() string {
		return "SELECT event_id, attempts FROM " + b.attempt + " WHERE consumer_group = ? AND event_id IN (" +
			strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ") AND " + crashedWhere
	})
}

// runningSet holds the ids of the events whose counted attempt is under
// way in this process (see "Overlapping copies" above).
type runningSet struct {
	mu sync.Mutex
	m  map[string]struct{}
}

// claim marks id running and reports true, or reports false when it
// already is (another copy's attempt runs here: do not count).
func (s *runningSet) claim(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[id]; ok {
		return false
	}
	if s.m == nil {
		s.m = map[string]struct{}{}
	}
	s.m[id] = struct{}{}
	return true
}

// release ends the claims on ids.
func (s *runningSet) release(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		delete(s.m, id)
	}
}

// crashDecision is the failure an event parked as a crash is parked with
// (class Crash: not retried).
func crashDecision(attempts int) decision {
	return failed(ClassCrash, fmt.Errorf("%w (%d attempts)", ErrHandlerCrash, attempts-1))
}
