package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/failpoint"
)

// Held claims: one write per row for batch sends.
//
// With a BatchSink, a claim does not write its rows SENDING. Its transaction
// locks them (SELECT ... FOR UPDATE SKIP LOCKED) and stays open while they
// are sent; the outcomes (SENT, RETRY, DEAD) are written in that same
// transaction, which then commits. So each row is written once, and:
//
//   - Nothing is lost. A crash, a lost connection or a rollback before the
//     commit leaves the rows as they were (PENDING or RETRY), claimable at
//     once; there is no SENDING state and no lease to wait for.
//   - At least once. A send that succeeded is recorded only by the commit;
//     when the commit fails the rows are sent again, under the same event
//     id, and consumers deduplicate.
//   - Order per aggregate. A held row is still PENDING to everyone else, so
//     its aggregate's next version is no head until the commit writes it SENT.
//   - Other dispatchers keep moving. They pass held rows over (SKIP LOCKED),
//     and the head check's subquery reads without locking.
//   - Bounded lock hold, also for a zombie. The client ends the transaction
//     at LeaseDuration after the claim (its context), and a buffered row that
//     waited too long is not sent (maxWait). A client that stopped running
//     (paused, partitioned) cannot end anything, so the server does: the
//     claim sets the dialect's IdleTransactionLimit to LeaseDuration, and a
//     session left waiting longer is ended and its transaction rolled back.
//     The zombie's late outcome writes then fail on the dead connection and
//     change nothing; a send it still makes is one more duplicate.
//
// A held claim keeps one pooled connection until it commits; a dispatcher
// holds at most maxHeldClaims of them. Rows of a Sink that is not a
// BatchSink keep the two writes (PENDING -> SENDING with owner token and
// lease -> SENT): their sends are one per row and may be slow (a FuncSink
// calling an HTTP service), so a claim's locks would stay taken for many
// sends in turn.

// maxHeldClaims bounds the held claims of one dispatcher, and so the pooled
// connections they keep.
const maxHeldClaims = 4

// heldTx is the open transaction of a held claim, on a connection of its
// own (so the idle limit can be undone on it after the commit).
type heldTx struct {
	q      queries
	conn   *sqlx.Conn
	tx     *sqlx.Tx
	ctx    context.Context // the transaction's: ends it LeaseDuration after the claim
	cancel context.CancelFunc
	reset  string // undoes the idle limit on conn ("" : nothing to undo)
}

// claimHeld is the claim of a held dispatcher: it locks up to n due head
// rows in a READ COMMITTED transaction and returns it open in res.hold (no
// transaction when no row was due), with the server's idle limit set to
// idle. Statements run on ctx; the transaction itself lives until lease has
// passed, or until end. A dispatcher passes LeaseDuration for both.
func (q queries) claimHeld(ctx context.Context, db *sqlx.DB, token string, n int, lease, idle time.Duration, steps stepSet, from any) (claimResult, error) {
	claimedAt := time.Now()
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lease)
	conn, err := db.Connx(ctx)
	if err != nil {
		cancel()
		return claimResult{}, fmt.Errorf("outbox: claim: connection: %w", err)
	}
	h := &heldTx{q: q, conn: conn, ctx: hctx, cancel: cancel}
	h.tx, err = conn.BeginTxx(hctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		h.end()
		return claimResult{}, fmt.Errorf("outbox: claim: begin: %w", err)
	}
	res, err := q.lockDue(ctx, h.tx, token, n, steps, from, claimedAt)
	if err != nil || len(res.rows) == 0 {
		h.end()
		res.rows = nil
		return res, err
	}
	set, reset := q.d.IdleTransactionLimit(idle)
	h.reset = reset // before set: a set that failed half-way is undone too
	if _, err := h.tx.ExecContext(ctx, set); err != nil {
		h.end()
		return claimResult{}, fmt.Errorf("outbox: claim: idle limit: %w", err)
	}
	res.hold = h
	return res, nil
}

// markSent writes SENT, with token, for ids (at most maxInList) and checks
// that every one of them changed.
func (h *heldTx) markSent(token string, ids []string) error {
	query, args, err := h.q.inList(h.q.heldSent, []any{token}, ids)
	if err != nil {
		return fmt.Errorf("outbox: mark: %w", err)
	}
	return h.exec(len(ids), query, args...)
}

// markFailed writes RETRY (after delay) or DEAD for r.
func (h *heldTx) markFailed(r claimedRow, dead bool, delay time.Duration, code, text string) error {
	if dead {
		return h.exec(1, h.q.heldDead, r.token, code, text, r.EventID, r.Status, r.RetryCount)
	}
	return h.exec(1, h.q.heldRetry, r.token, delay.Microseconds(), code, text, r.EventID, r.Status, r.RetryCount)
}

// exec runs an outcome update in the claim's transaction. Every row must
// change: the transaction holds their locks, so fewer means it is not the
// transaction that locked them any more, and it must not commit.
func (h *heldTx) exec(want int, query string, args ...any) error {
	res, err := h.q.stmts.TxExec(h.ctx, h.tx, query, args...)
	if err != nil {
		return fmt.Errorf("outbox: mark: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("outbox: mark: %w", err)
	}
	if n != int64(want) {
		return fmt.Errorf("outbox: mark: %d of %d rows changed in the claim's own transaction", n, want)
	}
	return nil
}

func (h *heldTx) commit() error {
	if err := h.tx.Commit(); err != nil {
		return fmt.Errorf("outbox: mark: commit: %w", err)
	}
	return nil
}

// end rolls back what was not committed, undoes the idle limit and gives
// the connection back; a connection whose limit could not be undone is
// closed instead, so that no other user of the pool inherits it.
func (h *heldTx) end() {
	if h.tx != nil {
		_ = h.tx.Rollback() // after a commit: a no-op
	}
	if h.reset != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := h.conn.ExecContext(ctx, h.reset)
		cancel()
		if err != nil {
			_ = h.conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	_ = h.conn.Close()
	h.cancel()
}

// heldClaimer is the claim strategy of held claims.
type heldClaimer struct {
	d    *Dispatcher
	open atomic.Int64 // held claims not yet committed (at most maxHeldClaims)
}

func (hc *heldClaimer) claim(ctx context.Context, token string, n int, steps stepSet, from any) (claimResult, error) {
	lease := hc.d.cfg.LeaseDuration
	return hc.d.q.claimHeld(ctx, hc.d.cfg.DB, token, n, lease, lease, steps, from)
}

// full: the dispatcher holds maxHeldClaims open transactions (a finishing
// claim frees a sender, which wakes the loop).
func (hc *heldClaimer) full() bool { return hc.open.Load() >= maxHeldClaims }

// units tracks the claim's open transaction (heldClaim, one per claim,
// which every row points to) and splits its rows into the BatchSink's
// groups.
func (hc *heldClaimer) units(res claimResult) [][]claimedRow {
	c := &heldClaim{tx: res.hold}
	for i := range res.rows {
		res.rows[i].hold = c
	}
	units := hc.batches(res.rows)
	c.left = len(units)
	hc.open.Add(1)
	return units
}

func (hc *heldClaimer) start() {} // the outcomes are written by the senders
func (hc *heldClaimer) stop()  {}

// release hands back, unsent, the units claimed ahead that no sender took
// (at shutdown): they need no write, the claim's commit or rollback frees
// them.
func (hc *heldClaimer) release(units [][]claimedRow) {
	for _, u := range units {
		outs := make([]Outcome, len(u))
		logs := make([]logrus.FieldLogger, len(u))
		for i, r := range u {
			outs[i] = Outcome{EventID: r.EventID, Destination: r.Destination, EventType: r.EventType,
				Attempt: r.RetryCount + 1, TookOver: r.tookOver}
			logs[i] = hc.d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "destination": r.Destination})
		}
		hc.settle(context.Background(), u, outs, nil, logs)
	}
}

// batches splits one claim's rows into what a sender sends at once: the
// groups of the BatchSink (a row it left out goes alone).
func (hc *heldClaimer) batches(rows []claimedRow) [][]claimedRow {
	if len(rows) < 2 {
		return oneByOne(rows)
	}
	msgs := make([]*Message, len(rows))
	index := make(map[*Message]int, len(rows))
	for i := range rows {
		msgs[i] = &Message{Event: rows[i].event(), Attempt: rows[i].RetryCount + 1}
		index[msgs[i]] = i
	}
	groups := hc.safeBatches(msgs)
	out := make([][]claimedRow, 0, len(groups))
	seen := 0
	for _, g := range groups {
		u := make([]claimedRow, 0, len(g))
		for _, m := range g {
			if i, ok := index[m]; ok {
				u = append(u, rows[i])
				delete(index, m) // each row once
			}
		}
		if len(u) > 0 {
			out = append(out, u)
			seen += len(u)
		}
	}
	if seen < len(rows) {
		// A sink that dropped messages from its groups: they go alone.
		for i := range rows {
			if _, left := index[msgs[i]]; left {
				out = append(out, rows[i:i+1:i+1])
			}
		}
	}
	return out
}

// safeBatches is the BatchSink's Batches, a panic in it turned into no
// groups (every row then goes alone).
func (hc *heldClaimer) safeBatches(msgs []*Message) (groups [][]*Message) {
	defer func() {
		if p := recover(); p != nil {
			hc.d.cfg.Logger.Warnf("outbox: sink Batches panicked: %v; sending the rows one by one", rmqlog.ScrubValue(p))
			groups = nil
		}
	}()
	return hc.d.batch.Batches(msgs)
}

// heldClaim is a held claim as the dispatcher tracks it: its units are
// sent by the senders, and the one that finishes the last unit writes every
// outcome and commits.
type heldClaim struct {
	tx   *heldTx
	mu   sync.Mutex
	left int // units not finished
	outs []heldOutcome
}

// heldOutcome is one row's outcome, to be written in the claim's
// transaction (or not at all: handed back).
type heldOutcome struct {
	r          claimedRow
	out        Outcome // Status: SENT, RETRY, DEAD, or the released status
	handedBack bool    // not sent: nothing is written, the rollback or commit frees it
	class      Class
	code, text string
	log        logrus.FieldLogger
}

// settle turns the results of one unit of a held claim (errs; nil: the
// unit was not sent) into outcomes, and finishes the unit: the sender that
// finishes the claim's last unit writes them all and commits.
func (hc *heldClaimer) settle(sendCtx context.Context, u []claimedRow, outs []Outcome, errs []error, logs []logrus.FieldLogger) {
	d := hc.d
	res := make([]heldOutcome, len(u))
	for i, r := range u {
		o := heldOutcome{r: r, out: outs[i], log: logs[i]}
		switch {
		case errs == nil:
			o.handedBack, o.out.Status = true, releasedStatus(r)
		case errs[i] == nil:
			// The receiver has the message; only the commit records it. A
			// crash before the commit leaves the row as it was, and it is
			// sent again: consumers deduplicate.
			failpoint.Inject(failpoint.AfterSend)
			d.countSend(r, "success", "")
			o.out.Status = StatusSent
		case sendCtx.Err() != nil:
			// Shutdown cancelled the send: hand the row back without using
			// a retry.
			o.out.Err = errs[i]
			o.handedBack, o.out.Status = true, releasedStatus(r)
		default:
			err := errs[i]
			o.out.Err = err
			o.class = sendClassOf(err)
			o.code = truncate(CodeOf(err), maxErrorCode)
			o.text = truncate(d.cfg.Redact(err.Error()), maxErrorMessage)
			if o.class == ClassPermanent || r.RetryCount >= d.cfg.MaxRetries {
				o.out.Status = StatusDead
				d.countSend(r, "dead", o.class.String())
			} else {
				o.out.Status = StatusRetry
				o.out.RetryIn = Backoff(r.RetryCount, d.cfg.BackoffBase, d.cfg.BackoffMax)
				result := "retry"
				if o.class == ClassUnknown {
					result = "unknown"
				}
				d.countSend(r, result, o.class.String())
			}
		}
		res[i] = o
	}
	h := u[0].hold
	h.mu.Lock()
	h.outs = append(h.outs, res...)
	h.left--
	last := h.left == 0
	h.mu.Unlock()
	if last {
		hc.commit(h)
	}
}

// commit writes a held claim's outcomes in its transaction (one UPDATE
// for the SENT rows, one per failed row), commits, and reports them.
func (hc *heldClaimer) commit(h *heldClaim) {
	d := hc.d
	var sent []string
	var token string
	for _, o := range h.outs {
		if o.out.Status == StatusSent {
			sent = append(sent, o.r.EventID)
			token = o.r.token
		}
	}
	var merr error
	for len(sent) > 0 && merr == nil {
		k := min(len(sent), maxInList)
		merr = h.tx.markSent(token, sent[:k])
		sent = sent[k:]
	}
	for _, o := range h.outs {
		if merr != nil {
			break
		}
		if !o.handedBack && o.out.Status != StatusSent {
			merr = h.tx.markFailed(o.r, o.out.Status == StatusDead, o.out.RetryIn, o.code, o.text)
		}
	}
	if merr == nil {
		merr = h.tx.commit()
	}
	h.tx.end()
	hc.open.Add(-1)
	for _, o := range h.outs {
		switch {
		case o.handedBack:
			d.stats.released.Add(1)
			d.record(o.out, true, nil, o.log)
			continue
		case merr != nil:
			d.record(o.out, false, merr, o.log)
			continue
		}
		switch o.out.Status {
		case StatusSent:
			d.stats.sent.Add(1)
		case StatusDead:
			d.stats.dead.Add(1)
			o.log.WithFields(logrus.Fields{"class": o.class.String(), "code": o.code, "retries": o.r.RetryCount}).
				Warn("outbox: row is DEAD: " + o.text)
		case StatusRetry:
			if o.class == ClassUnknown {
				d.stats.unknown.Add(1)
			} else {
				d.stats.retried.Add(1)
			}
		}
		if o.r.AggregateType != "" && o.out.Status != StatusRetry {
			d.rescan.Store(true) // the aggregate's next version may be a head now
		}
		d.record(o.out, true, nil, o.log)
	}
	d.Notify()
}
