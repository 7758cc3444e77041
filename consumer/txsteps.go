package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/wire"
)

// The steps every message goes through, in single mode (Process) and in
// batch mode (ProcessBatch, batch.go) alike:
//
//	check       no transaction: decode or adopt, declared hash, route, Validate
//	            (dedup cache hit, or the duplicate-storm pre-read: duplicate)
//	dedupStep   first in the transaction: the consume_log row, one statement
//	eventSteps  guardStep (aggregate version), then handlerStep (the handler,
//	            its result ref, the attempts cleared with the success)
//	commit
//	result      after the transaction: the outcome, the cache and counters;
//	            a failure goes on to fail or park (failures.go)
//
// Single mode runs one event per transaction (apply, applyTx); batch mode
// runs the same steps for many events in one transaction (batch.go).

// item is a message that passed check: its event and route, and its place
// in a batch (ProcessBatch). The transaction steps work on items.
type item struct {
	idx   int
	m     Message
	ev    Event
	route Route
	// Crash counting (crash.go): the previous attempt crashed; the event is
	// to be parked as a crash instead of run; the count that said so.
	crashed, crashPark bool
	attempts           int
	// batch: the event runs in a batch's shared transaction, whose one
	// DELETE clears the attempt rows of the events it applies
	// (clearBatchAttempts), so its steps issue none of their own.
	batch bool
}

// check runs what needs no transaction: decoding (or adoption), the
// declared payload hash, the route and Validate. It returns the item to
// apply, or the outcome a check decided (parked, ignored, retried) and false.
func (p *Processor) check(ctx context.Context, m Message) (item, Outcome, bool) {
	m, env, err := p.decode(m) // the wire format, or an adopted identity (adopt.go)
	if err != nil {
		ev := malformedEvent(m)
		return item{}, p.park(ctx, m, ev, ClassData, fmt.Errorf("%w: %w", ErrMalformed, err), "", 0), false
	}
	ev := Event{
		ID: env.EventID, Type: env.EventType, Version: env.EventVersion,
		AggregateType: env.AggregateType, AggregateID: env.AggregateID, AggregateVersion: env.AggregateVersion,
		BusinessKey: env.BusinessKey, Headers: env.Headers, Payload: m.Body,
		PayloadHash: wire.Hash(m.Body), Delivery: m.Delivery,
	}
	if declared := m.Properties[wire.PropPayloadHash]; declared != "" && wire.NormalizeHash(declared) != ev.PayloadHash {
		return item{}, p.park(ctx, m, ev, ClassData, fmt.Errorf("%w: payload hash %s does not match the declared %s", ErrMalformed, ev.PayloadHash, clip(declared, 64)), "", 0), false
	}
	route, ok := p.cfg.Routes[ev.Type]
	if !ok {
		if p.cfg.UnknownType == UnknownIgnore {
			p.stats.ignored.Add(1)
			p.count(ev, ResultIgnored)
			return item{}, Outcome{Result: ResultIgnored, EventID: ev.ID}, false
		}
		return item{}, p.park(ctx, m, ev, ClassData, fmt.Errorf("%w %q", ErrUnknownEventType, ev.Type), "", 0), false
	}
	if route.Validate != nil {
		if err := callValidate(route.Validate, ev); err != nil {
			c := handlerClass(err)
			if c == ClassUnknown {
				c = ClassData
			}
			return item{}, p.fail(ctx, m, ev, c, err), false
		}
	}
	return item{m: m, ev: ev, route: route}, Outcome{}, true
}

// apply runs one checked event alone. A redelivery this processor saw
// committed, with the same hash, is a dedup hit without the database; so,
// during a duplicate storm, is one whose committed dedup row a point read
// finds. Anything else takes its own transaction (applyTx), and the result
// step turns what the transaction decided into the outcome.
func (p *Processor) apply(ctx context.Context, it item) Outcome {
	ev := it.ev
	if p.cache.hit(ev.ID, ev.PayloadHash) {
		return p.duplicate(ctx, ev)
	}
	// While the database has mostly been answering "duplicate" (a replay
	// after a rebalance or a restart), a committed dedup row is looked up
	// first, outside any transaction: one point read instead of BEGIN,
	// INSERT, ROLLBACK. Only a committed row with this very hash is trusted;
	// a miss, another hash or an error takes the transaction.
	if p.dups.storm() && p.preReadHit(ctx, ev) {
		p.dups.record(true)
		p.cache.add(ev.ID, ev.PayloadHash)
		return p.duplicate(ctx, ev)
	}
	// Counted unless another copy of the event is under way in this
	// process (crash.go): the claim lasts until the outcome is recorded.
	if p.counting() && !it.ev.counted && p.running.claim(ev.ID) {
		defer p.running.release(ev.ID)
		if !p.covered(ctx, ev) {
			p.countAttempt(ctx, &it) // a suspect of its queue's window (window.go)
		}
	}
	return p.result(ctx, it, p.applyTx(ctx, it))
}

// preReadHit reads the dedup row outside a transaction (the duplicate-storm
// shortcut) and reports whether it is committed with ev's hash. A plain read
// sees another transaction's uncommitted row when the session runs at READ
// UNCOMMITTED; ACKing on that row would lose the event if that transaction
// rolls back. So the same statement reads the session's isolation level, and
// at READ UNCOMMITTED the answer is not trusted and the pre-read is turned
// off for good (the transaction path, whose INSERT waits on the row lock,
// decides). A server that knows none of the dialect's isolation
// expressions turns it off too.
func (p *Processor) preReadHit(ctx context.Context, ev Event) bool {
	i := p.preRead.Load()
	off := int32(len(p.q.preRead))
	if i >= off {
		return false
	}
	var r struct {
		Hash      string `db:"h"`
		Isolation string `db:"iso"`
	}
	err := p.stmts.Get(ctx, &r, p.q.preRead[i], p.cfg.Group, ev.ID)
	switch {
	case err != nil && p.d.IsUnknownVariable(err):
		p.preRead.CompareAndSwap(i, i+1)
		return false
	case err != nil:
		return false
	case p.d.ReadUncommitted(r.Isolation):
		if p.preRead.Swap(off) != off {
			p.cfg.Logger.WithField("consumer_group", p.cfg.Group).
				Debug("consumer: sessions run at READ UNCOMMITTED; the duplicate-storm pre-read is off")
		}
		return false
	}
	return r.Hash == ev.PayloadHash
}

// applyTx is one event's transaction: the dedup step, then the event's
// steps, then COMMIT when they applied the event or skipped it as stale.
// The transaction has ended (committed or rolled back) when applyTx
// returns, so the result step's writes on other connections never wait on
// its locks.
func (p *Processor) applyTx(ctx context.Context, it item) decision {
	var tx *sqlx.Tx
	var d decision
	var err error
	for try := 1; ; try++ {
		if tx, err = p.begin(ctx); err != nil {
			return failed(ClassTransient, err)
		}
		if d, err = p.dedupStep(ctx, tx, it.ev); err == nil {
			break
		}
		_ = tx.Rollback()
		if !p.dedupAgain(err, try) {
			return failed(ClassTransient, err)
		}
	}
	defer func() { _ = tx.Rollback() }() // after the commit: a no-op
	switch {
	case d.state == evNew && it.crashPark:
		d = crashDecision(it.attempts) // rolled back: parked, not run
	case d.state == evNew:
		d = p.eventSteps(ctx, tx, it)
	}
	if d.state == evApplied || d.state == evStale {
		// A commit error is ambiguous; the redelivery finds out (a dedup
		// hit if it did commit).
		if err := p.commit(tx); err != nil {
			return failed(ClassTransient, err)
		}
	}
	return d
}

// dedupDeadlockTries bounds how many times a transaction whose dedup step
// lost a deadlock is begun at once (dedupAgain).
const dedupDeadlockTries = 3

// dedupAgain reports whether a transaction whose dedup step failed with err
// on its try-th run is to be begun again at once. Only a MySQL/MariaDB
// deadlock is: the dedup step is the transaction's first statement, so
// nothing else is lost, and it happens without any fault. When the
// transaction that inserted an event's dedup row rolls back (its handler
// failed) while copies of the event wait on that row, InnoDB lets the
// waiters take gap locks, and their inserts deadlock one another. Each of
// those copies would otherwise be a failed attempt, and more of them than
// MaxRetries would park a healthy event at the retry limit. PostgreSQL's
// waiters do not deadlock (one inserts, the others wait on it), and its
// IsDeadlock also reports the serialization failure of a REPEATABLE READ
// snapshot, which is left to the redelivery as before. A lock wait timeout
// is not retried: it has already waited its full bound.
func (p *Processor) dedupAgain(err error, try int) bool {
	return try < dedupDeadlockTries && p.d.Name() == dialect.MySQL.Name() && p.d.IsDeadlock(err) && ctxAlive(err)
}

// ctxAlive reports whether err is not a context's end (a canceled or
// expired delivery is not run again).
func ctxAlive(err error) bool {
	return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
}

// eventState is where one event stands in its transaction.
type eventState int

const (
	evNew       eventState = iota // dedup row inserted by this transaction: the event's steps run next
	evDuplicate                   // dedup row existed (its hash in decision.existing)
	evApplied                     // handler ran; the effect is in the transaction
	evStale                       // older version, marked stale in the transaction
	evFailed                      // the event failed; decision.class and err say why
)

// decision is what the transaction steps decided for one event; the
// result step (result) turns it into the Outcome once the transaction has
// ended. Single and batch mode share both.
type decision struct {
	state    eventState
	existing string // evDuplicate: the stored payload hash
	class    Class  // evFailed
	err      error  // evFailed
	gap      bool   // evFailed by a strict version gap
	last     int64  // evStale: the aggregate's last applied version
}

func failed(c Class, err error) decision { return decision{state: evFailed, class: c, err: err} }

// dedupStep inserts ev's dedup row, first in the transaction and in one
// statement: a concurrent delivery of the same event blocks on the row's
// lock until this transaction ends. On a duplicate key the statement locks
// the existing (committed) row and says whether its hash is ours; only
// another hash costs one more statement, a locking read of the stored one.
// Where the dialect records new keys with InsertNew (PostgreSQL), the
// insert skips an existing row instead, after waiting for the transaction
// that wrote it, and a duplicate costs that locking read.
// An error is the transaction's (the caller fails the event or the batch).
func (p *Processor) dedupStep(ctx context.Context, tx *sqlx.Tx, ev Event) (decision, error) {
	if p.q.insertLogNew != "" {
		return p.dedupStepNew(ctx, tx, ev)
	}
	inserted, v, err := p.d.ExecReturning(ctx, cached{p.stmts, tx}, p.q.insertLog,
		p.cfg.Group, ev.ID, ev.Type, ev.PayloadHash, ev.Delivery.ReconsumeTimes, ev.PayloadHash)
	if err != nil {
		return decision{}, fmt.Errorf("consumer: insert consume log: %w", err)
	}
	d := decision{state: evNew}
	switch {
	case inserted:
	case v == dupSameHash:
		d = decision{state: evDuplicate, existing: ev.PayloadHash}
	default:
		if d, err = p.storedHash(ctx, tx, ev); err != nil {
			return decision{}, err
		}
	}
	p.dups.record(!inserted)
	return d, nil
}

// dedupStepNew is dedupStep with InsertNew: one Exec for a new key, and
// the locking read of the stored hash for a duplicate.
func (p *Processor) dedupStepNew(ctx context.Context, tx *sqlx.Tx, ev Event) (decision, error) {
	inserted, err := p.d.ExecInsertNew(ctx, cached{p.stmts, tx}, p.q.insertLogNew,
		p.cfg.Group, ev.ID, ev.Type, ev.PayloadHash, ev.Delivery.ReconsumeTimes)
	if err != nil {
		return decision{}, fmt.Errorf("consumer: insert consume log: %w", err)
	}
	d := decision{state: evNew}
	if !inserted {
		if d, err = p.storedHash(ctx, tx, ev); err != nil {
			return decision{}, err
		}
	}
	p.dups.record(!inserted)
	return d, nil
}

// storedHash is a duplicate's decision: the hash its committed dedup row
// stores, read with the row's lock.
func (p *Processor) storedHash(ctx context.Context, tx *sqlx.Tx, ev Event) (decision, error) {
	d := decision{state: evDuplicate}
	if err := p.stmts.TxGet(ctx, tx, &d.existing, p.q.selectLogHash, p.cfg.Group, ev.ID); err != nil {
		return decision{}, fmt.Errorf("consumer: read consume log: %w", err)
	}
	return d, nil
}

// eventSteps runs the steps of an event whose dedup row this transaction
// inserted: the version guard, then the handler. A failure is the event's
// own (evFailed); the caller undoes what the steps wrote, by a rollback of
// the transaction or, in a batch, of the event's savepoint.
func (p *Processor) eventSteps(ctx context.Context, tx *sqlx.Tx, it item) decision {
	if d := p.guardStep(ctx, tx, it); d.state != evNew {
		return d
	}
	return p.handlerStep(ctx, tx, it)
}

// guardStep is the aggregate-version guard (I6). It locks the aggregate's
// version row, decides, and moves the version forward when the event
// applies (evNew: go on to the handler). A stale event is recorded STALE
// with its attempts cleared (evStale); a strict gap fails with class Wait.
// Two events of one aggregate serialize on that row. The row is created (or
// locked, if it exists) by one upsert that takes the exclusive lock at
// once: SELECT-then-INSERT would deadlock when several first events of one
// aggregate race (shared locks on the duplicate key, then each asks for an
// exclusive one). Version 0 means "none applied".
func (p *Processor) guardStep(ctx context.Context, tx *sqlx.Tx, it item) decision {
	ev, g := it.ev, p.cfg.Group
	mode := it.route.Version
	if mode == VersionInherit {
		mode = p.cfg.VersionMode
	}
	if mode == VersionNone || ev.AggregateType == "" || ev.AggregateVersion <= 0 {
		return decision{state: evNew}
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.q.lockVersion, g, ev.AggregateType, ev.AggregateID); err != nil {
		return failed(ClassTransient, fmt.Errorf("consumer: lock aggregate version: %w", err))
	}
	var last int64
	if err := p.stmts.TxGet(ctx, tx, &last, p.q.selectVersion, g, ev.AggregateType, ev.AggregateID); err != nil {
		return failed(ClassTransient, fmt.Errorf("consumer: read aggregate version: %w", err))
	}
	v := ev.AggregateVersion
	var stale, gap bool
	switch {
	case mode == VersionStrict && last == 0:
		stale, gap = v < p.cfg.StrictFirstVersion, v > p.cfg.StrictFirstVersion
	case v <= last:
		stale = true
	case mode == VersionStrict && v != last+1:
		gap = true
	}
	switch {
	case stale:
		if _, err := p.stmts.TxExec(ctx, tx, p.q.markStale, g, ev.ID); err != nil {
			return failed(ClassTransient, fmt.Errorf("consumer: mark stale: %w", err))
		}
		if err := p.clearAttemptsTx(ctx, tx, it); err != nil {
			return failed(ClassTransient, err)
		}
		return decision{state: evStale, last: last}
	case gap:
		d := failed(ClassWait, fmt.Errorf("%w: %s/%s version %d", ErrVersionGap, ev.AggregateType, ev.AggregateID, v))
		d.gap = true
		return d
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.q.updateVersion, v, ev.ID, g, ev.AggregateType, ev.AggregateID); err != nil {
		return failed(ClassTransient, fmt.Errorf("consumer: update aggregate version: %w", err))
	}
	return decision{state: evNew}
}

// handlerStep runs the route's handler in the transaction, then records
// the result reference it set and clears the event's attempts, so the
// bookkeeping of earlier failures commits with the success, atomically.
func (p *Processor) handlerStep(ctx context.Context, tx *sqlx.Tx, it item) decision {
	h := &handling{}
	ev := it.ev
	ev.handling = h // this call's Event only: Validate's copy and it.ev have none
	err := callHandler(context.WithValue(ctx, handlingKey{}, h), it.route.Handler, tx, ev)
	ref := h.finish()
	if err != nil {
		return failed(handlerClass(err), err)
	}
	if ref != "" {
		if _, err := p.stmts.TxExec(ctx, tx, p.q.setResultRef, ref, p.cfg.Group, it.ev.ID); err != nil {
			return failed(ClassTransient, fmt.Errorf("consumer: set result ref: %w", err))
		}
	}
	if err := p.clearAttemptsTx(ctx, tx, it); err != nil {
		return failed(ClassTransient, err)
	}
	return decision{state: evApplied}
}

// mayHaveAttempts reports whether ev's event may have an attempt row, so
// that its success or dedup hit must delete it: an attempt counted before
// its handler (crash counting, crash.go: then it has one), a retry (ReconsumeTimes > 0:
// this very message failed before, here or on another instance), or an id
// this process saw fail or found failed at Consumer.Start (another copy of
// it failed; this copy is a first delivery). Any other first delivery - the
// common path - issues no delete at all: an attempt row exists only for
// events whose some copy failed, and that copy comes back as a retry, whose
// success or dedup hit deletes it (a process that crashed between recording
// the failure and answering the broker leaves it to the restarted process,
// which loads the ids at Start).
func (p *Processor) mayHaveAttempts(ev Event) bool {
	return !ev.cleared && (ev.counted || ev.Delivery.ReconsumeTimes > 0 || p.failed.has(ev.ID))
}

// clearAttemptsTx deletes it.ev's attempt row, if it may have one, in the
// transaction that commits its success: the bookkeeping of the failures
// goes with the success, atomically. In a batch, the batch's one DELETE
// does it for all its events (clearBatchAttempts).
func (p *Processor) clearAttemptsTx(ctx context.Context, tx *sqlx.Tx, it item) error {
	ev := it.ev
	if it.batch || !p.mayHaveAttempts(ev) {
		return nil
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.q.deleteAttempt, p.cfg.Group, ev.ID); err != nil {
		return fmt.Errorf("consumer: clear attempts: %w", err)
	}
	return nil
}

// begin starts the transaction of one event or one batch, at the sessions'
// default isolation level (the handler's writes share it).
func (p *Processor) begin(ctx context.Context) (*sqlx.Tx, error) {
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("consumer: begin: %w", err)
	}
	return tx, nil
}

// commit commits the transaction of one event or one batch.
func (p *Processor) commit(tx *sqlx.Tx) error {
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("consumer: commit: %w", err)
	}
	failpoint.Inject(failpoint.AfterConsumeCommit)
	return nil
}

// result is the last step, after the transaction has ended: it turns what
// the transaction decided for it.ev into the outcome, with what must follow
// a commit (the cache, the counters) or a rollback (the dedup hit, the
// conflict's dead letter, the failed attempt's retry or park).
func (p *Processor) result(ctx context.Context, it item, d decision) Outcome {
	ev, g := it.ev, p.cfg.Group
	switch d.state {
	case evApplied:
		p.failed.remove(ev.ID)
		p.cache.add(ev.ID, ev.PayloadHash) // only now: the effect is committed
		p.stats.applied.Add(1)
		p.count(ev, ResultApplied)
		if p.cfg.Metrics != nil && !ev.Delivery.StoredAt.IsZero() {
			p.cfg.Metrics.ConsumerLag.WithLabelValues(g).Observe(time.Since(ev.Delivery.StoredAt).Seconds())
		}
		return Outcome{Result: ResultApplied, EventID: ev.ID}
	case evStale:
		p.failed.remove(ev.ID)
		p.cache.add(ev.ID, ev.PayloadHash)
		p.stats.stale.Add(1)
		metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerStale }, g, p.typeLabel(ev))
		p.count(ev, ResultStale)
		p.logStale(ev, d.last)
		return Outcome{Result: ResultStale, EventID: ev.ID}
	case evDuplicate:
		if d.existing == ev.PayloadHash {
			p.cache.add(ev.ID, d.existing) // the row we locked is committed
			return p.duplicate(ctx, ev)
		}
		err := fmt.Errorf("%w: event %s applied with payload hash %s, redelivered with %s", ErrConflict, ev.ID, d.existing, ev.PayloadHash)
		return p.park(ctx, it.m, ev, ClassConflict, err, d.existing, 0)
	case evFailed:
		if d.gap {
			p.stats.gaps.Add(1)
			metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerGaps }, g, p.typeLabel(ev))
		}
		return p.fail(ctx, it.m, ev, d.class, d.err)
	}
	// evNew never leaves the transaction steps; fail safe if it does.
	return p.fail(ctx, it.m, ev, ClassTransient, fmt.Errorf("consumer: event %s left undecided", ev.ID))
}

// duplicate counts and returns a dedup hit: the event's effect is committed
// with this payload hash, so the message is ACKed without the handler. The
// attempt row of an event that may have one is deleted first (a dedup hit
// has no transaction of its own to do it in).
func (p *Processor) duplicate(ctx context.Context, ev Event) Outcome {
	if ev.cleared {
		p.failed.remove(ev.ID) // deleted with its batch's commit
	}
	if p.mayHaveAttempts(ev) {
		bctx, cancel := bookkeeping(ctx)
		_, err := p.stmts.Exec(bctx, p.q.deleteAttempt, p.cfg.Group, ev.ID)
		cancel()
		if err != nil {
			// The next copy (or the restarted process) tries again.
			p.cfg.Logger.WithFields(p.fields(ev)).WithError(err).Warn("consumer: cannot clear the attempts of a duplicate")
		} else {
			p.failed.remove(ev.ID)
		}
	}
	p.stats.duplicates.Add(1)
	metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerDedupHits }, p.cfg.Group, p.typeLabel(ev))
	p.count(ev, ResultDuplicate)
	return Outcome{Result: ResultDuplicate, EventID: ev.ID}
}

func callHandler(ctx context.Context, h Handler, tx *sqlx.Tx, ev Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrHandlerPanic, rmqlog.ScrubValue(r))
		}
	}()
	return h(ctx, tx, ev)
}

func callValidate(v func(Event) error, ev Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = BadData(fmt.Errorf("validate panicked: %v", rmqlog.ScrubValue(r)))
		}
	}()
	return v(ev)
}
