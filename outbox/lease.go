package outbox

import (
	"context"
	"errors"

	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/failpoint"
)

// Leased claims: the claim strategy for a Sink that is not a BatchSink.
//
// A claim is one short transaction that writes its rows SENDING with an
// owner token and a lease (queries.claimWith), then commits: the rows are
// this dispatcher's until the lease ends, and another dispatcher takes over
// a row whose lease expired (stepExpired). Each row is sent alone, and each
// outcome is written with the token as a condition, so an outcome that comes
// after a takeover changes nothing (LostLease). A failure is written at once
// (RETRY or DEAD, settleRow); the successes go to the marker (marker.go),
// which writes SENT for a claim's rows in one UPDATE. So a row costs two
// writes (SENDING, then its outcome), and a claim holds no lock while its
// rows are sent: sends may be slow (a FuncSink calling an HTTP service).

// leaseClaimer is the claim strategy of leased claims.
type leaseClaimer struct {
	d *Dispatcher
	m *marker // writes the SENT outcomes
}

func (l *leaseClaimer) claim(ctx context.Context, token string, n int, steps stepSet, from any) (claimResult, error) {
	return l.d.q.claimWith(ctx, l.d.cfg.DB, token, n, l.d.cfg.LeaseDuration, steps, from)
}

// full is never true: a leased claim keeps no connection.
func (l *leaseClaimer) full() bool { return false }

// units registers the claim with the marker; every row is sent alone.
func (l *leaseClaimer) units(res claimResult) [][]claimedRow {
	l.m.begin(res.rows[0].token, len(res.rows))
	return oneByOne(res.rows)
}

// settle writes the outcome of each row of u: a row not sent is handed
// back, a failed one is written RETRY or DEAD, and a sent one is left to
// the marker.
func (l *leaseClaimer) settle(sendCtx context.Context, u []claimedRow, outs []Outcome, errs []error, logs []logrus.FieldLogger) {
	for i, r := range u {
		if errs == nil {
			l.releaseOne(r, outs[i], logs[i])
			l.m.finishRow(r.token, nil)
			continue
		}
		l.m.finishRow(r.token, l.settleRow(sendCtx, r, outs[i], errs[i], logs[i]))
	}
}

func (l *leaseClaimer) start() { l.m.start() }
func (l *leaseClaimer) stop()  { l.m.stop() }

// settleRow records the outcome of r's send (err), except a success: that it
// returns, for the marker to write SENT in a batch.
func (l *leaseClaimer) settleRow(sendCtx context.Context, r claimedRow, out Outcome, err error, log logrus.FieldLogger) *sentRow {
	d := l.d
	if err == nil {
		// The receiver has the message; the row is not yet SENT. A crash here
		// resends it after the lease: consumers deduplicate.
		failpoint.Inject(failpoint.AfterSend)
		d.countSend(r, "success", "")
		return &sentRow{r: r, out: out}
	}
	out.Err = err
	if sendCtx.Err() != nil {
		// Shutdown cancelled the send: hand the row back without using a retry.
		l.releaseOne(r, out, log)
		return nil
	}
	var n int64
	var merr error
	class := sendClassOf(err)
	code := truncate(CodeOf(err), maxErrorCode)
	text := truncate(d.cfg.Redact(err.Error()), maxErrorMessage)
	if class == ClassPermanent || r.RetryCount >= d.cfg.MaxRetries {
		out.Status = StatusDead
		n, merr = d.mark(func(ctx context.Context) (int64, error) {
			return d.q.markDead(ctx, r.EventID, r.token, code, text)
		})
		if merr == nil && n == 1 {
			d.stats.dead.Add(1)
			if r.AggregateType != "" {
				d.rescan.Store(true)
			}
			log.WithFields(logrus.Fields{"class": class.String(), "code": code, "retries": r.RetryCount}).
				Warn("outbox: row is DEAD: " + text)
		}
		d.countSend(r, "dead", class.String())
	} else {
		out.Status = StatusRetry
		out.RetryIn = Backoff(r.RetryCount, d.cfg.BackoffBase, d.cfg.BackoffMax)
		n, merr = d.mark(func(ctx context.Context) (int64, error) {
			return d.q.markRetry(ctx, r.EventID, r.token, out.RetryIn, code, text)
		})
		if merr == nil && n == 1 {
			if class == ClassUnknown {
				d.stats.unknown.Add(1)
			} else {
				d.stats.retried.Add(1)
			}
			if errors.Is(err, ErrTopicNotExist) {
				// An operator's fix, not the event's fault: say which topic.
				log.WithFields(logrus.Fields{"destination": r.Destination, "code": code, "retries": r.RetryCount, "retry_in": out.RetryIn}).
					Warn("outbox: topic " + r.Destination + " does not exist on the broker; the row is retried with backoff until it is created (mqadmin updateTopic)")
			}
		}
		result := "retry"
		if class == ClassUnknown {
			result = "unknown"
		}
		d.countSend(r, result, class.String())
	}
	d.record(out, n == 1, merr, log)
	d.Notify() // a DEAD row unblocks its aggregate's next version
	return nil
}

// releaseOne hands r back unsent: PENDING (or RETRY when it has failed
// before), due at once, its retry count unchanged.
func (l *leaseClaimer) releaseOne(r claimedRow, out Outcome, log logrus.FieldLogger) {
	d := l.d
	out.Status = releasedStatus(r)
	n, merr := d.mark(func(ctx context.Context) (int64, error) { return d.q.release(ctx, r.EventID, r.token) })
	if merr == nil && n == 1 {
		d.stats.released.Add(1)
	}
	d.record(out, n == 1, merr, log)
	d.Notify()
}

// release hands back, unsent, the units claimed ahead that no sender took
// (at shutdown): one UPDATE per owner token.
func (l *leaseClaimer) release(units [][]claimedRow) {
	d := l.d
	var rows []claimedRow
	for _, u := range units {
		rows = append(rows, u...)
	}
	for _, g := range groupByToken(rows, func(r claimedRow) claimedRow { return r }) {
		ids := make([]string, len(g))
		for i, r := range g {
			ids[i] = r.EventID
		}
		n, merr := d.mark(func(ctx context.Context) (int64, error) {
			return d.q.releaseMany(ctx, g[0].token, ids)
		})
		if merr == nil {
			d.stats.released.Add(n)
		}
		// Fewer rows changed than asked: some had a new owner already. Which
		// ones is not worth a query at shutdown; none is reported lost.
		for _, r := range g {
			out := Outcome{EventID: r.EventID, Destination: r.Destination, EventType: r.EventType,
				Attempt: r.RetryCount + 1, TookOver: r.tookOver, Status: releasedStatus(r)}
			d.record(out, true, merr, d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "destination": r.Destination}))
			l.m.finishRow(r.token, nil)
		}
	}
}

// groupByToken splits xs by owner token, keeping first-seen order, in groups
// of at most maxInList.
func groupByToken[T any](xs []T, row func(T) claimedRow) [][]T {
	var order []string
	by := map[string][]T{}
	for _, x := range xs {
		t := row(x).token
		if _, ok := by[t]; !ok {
			order = append(order, t)
		}
		by[t] = append(by[t], x)
	}
	var out [][]T
	for _, t := range order {
		g := by[t]
		for len(g) > 0 {
			k := min(len(g), maxInList)
			out = append(out, g[:k])
			g = g[k:]
		}
	}
	return out
}
