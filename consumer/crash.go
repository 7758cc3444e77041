package consumer

import (
	"context"
	"fmt"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// Crash counting: a handler that ends its process (a crash, os.Exit, an
// OOM kill, a SIGKILL) returns no error, so nothing is counted after it, and
// its message comes back from the queue's committed offset looking like a
// first delivery (ReconsumeTimes 0). Without a count taken BEFORE the
// handler runs, such a poison message would be redelivered and kill every
// process it reaches, forever.
//
// So, unless ProcessorConfig.NoCrashCount, every delivery that takes the
// database path counts its attempt in the consume_attempt table in its own
// autocommitted statement before its transaction begins (countAttempt). The
// row is marked last_class = 'crash' while the attempt runs:
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

// crashDecision is the failure an event parked as a crash is parked with
// (class Crash: not retried).
func crashDecision(attempts int) decision {
	return failed(ClassCrash, fmt.Errorf("%w (%d attempts)", ErrHandlerCrash, attempts-1))
}
