package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/metrics"
)

// Dispatcher claims due outbox rows and sends them through a Sink. Any
// number of dispatchers, in one process or many, can serve one table.
type Dispatcher struct {
	cfg   Config
	table Table
	q     queries

	wake  chan struct{}
	slots chan struct{}

	mu         sync.Mutex
	started    bool
	closed     bool
	stopLoop   context.CancelFunc
	stopSends  context.CancelFunc
	loopDone   chan struct{}
	sends      sync.WaitGroup
	background sync.WaitGroup

	stats struct {
		claimed, sent, retried, unknown, dead, tookOver, lostLeases, released, claimErrors, markErrors atomic.Int64
	}
}

// Stats are counters since the dispatcher was created.
type Stats struct {
	Claimed     int64 // rows claimed (including takeovers)
	Sent        int64 // rows marked SENT
	Retried     int64 // rows marked RETRY after a transient error
	Unknown     int64 // rows marked RETRY after an unknown result
	Dead        int64 // rows marked DEAD
	TookOver    int64 // rows claimed after another owner's lease expired
	LostLeases  int64 // outcomes not written because the row had a new owner
	Released    int64 // rows handed back at shutdown
	ClaimErrors int64 // failed claim transactions
	MarkErrors  int64 // outcomes that could not be written (the lease expires instead)
}

// NewDispatcher validates cfg (after WithDefaults) and returns a dispatcher
// that is not yet started.
func NewDispatcher(cfg Config) (*Dispatcher, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, err := NewTable(cfg.TablePrefix)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		cfg:   cfg,
		table: t,
		q:     newQueries(t.name),
		wake:  make(chan struct{}, 1),
		slots: make(chan struct{}, cfg.Concurrency),
	}
	d.cfg.Logger = cfg.Logger.WithFields(logrus.Fields{"component": "outbox", "dispatcher": cfg.Name})
	return d, nil
}

// Name returns the dispatcher's name (the owner token prefix).
func (d *Dispatcher) Name() string { return d.cfg.Name }

// Start begins polling and sending in background goroutines. Cancelling ctx
// stops claiming, as Shutdown does; call Shutdown or Close anyway to wait for
// the sends in flight. Start is idempotent; after Shutdown it returns
// ErrClosed.
func (d *Dispatcher) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if d.started {
		return nil
	}
	d.started = true
	loopCtx, stopLoop := context.WithCancel(ctx)
	sendCtx, stopSends := context.WithCancel(context.WithoutCancel(ctx))
	d.stopLoop, d.stopSends = stopLoop, stopSends
	d.loopDone = make(chan struct{})
	go d.loop(loopCtx, sendCtx)
	if d.cfg.Metrics != nil {
		d.background.Add(1)
		go d.refreshLoop(loopCtx)
	}
	return nil
}

// Notify wakes the dispatcher to claim at once instead of at the next poll.
// Call it after the transaction that enqueued rows has committed. It never
// blocks and is safe to call at any time, even before Start.
func (d *Dispatcher) Notify() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Shutdown stops claiming and waits for the sends in flight and their
// outcomes. When ctx ends first, the sends are cancelled, their rows are
// handed back (PENDING or RETRY, due at once) and ctx's error is returned.
// Idempotent; safe without Start.
func (d *Dispatcher) Shutdown(ctx context.Context) error {
	d.mu.Lock()
	d.closed = true
	started := d.started
	d.mu.Unlock()
	if !started {
		return nil
	}
	d.stopLoop()
	select {
	case <-d.loopDone:
	case <-ctx.Done():
		d.stopSends()
		<-d.loopDone
	}
	d.background.Wait()
	done := make(chan struct{})
	go func() { d.sends.Wait(); close(done) }()
	select {
	case <-done:
		d.stopSends()
		return nil
	case <-ctx.Done():
		d.stopSends()
		<-done
		return fmt.Errorf("outbox: shutdown: %w", ctx.Err())
	}
}

// Close stops at once: sends in flight are cancelled and their rows handed
// back. Idempotent.
func (d *Dispatcher) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := d.Shutdown(ctx)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Stats returns the dispatcher's counters.
func (d *Dispatcher) Stats() Stats {
	s := &d.stats
	return Stats{
		Claimed: s.claimed.Load(), Sent: s.sent.Load(), Retried: s.retried.Load(), Unknown: s.unknown.Load(),
		Dead: s.dead.Load(), TookOver: s.tookOver.Load(), LostLeases: s.lostLeases.Load(),
		Released: s.released.Load(), ClaimErrors: s.claimErrors.Load(), MarkErrors: s.markErrors.Load(),
	}
}

func (d *Dispatcher) loop(ctx, sendCtx context.Context) {
	defer close(d.loopDone)
	ticker := time.NewTicker(d.cfg.PollInterval)
	defer ticker.Stop()
	for {
		d.drain(ctx, sendCtx)
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
		case <-ticker.C:
		}
	}
}

// drain claims and dispatches until a claim comes back short, the send slots
// are full (a finishing send wakes the loop again) or ctx ends.
func (d *Dispatcher) drain(ctx, sendCtx context.Context) {
	for ctx.Err() == nil {
		n := 0
	acquire:
		for n < d.cfg.BatchSize {
			select {
			case d.slots <- struct{}{}:
				n++
			default:
				break acquire
			}
		}
		if n == 0 {
			return
		}
		rows, err := d.claim(ctx, n)
		for i := len(rows); i < n; i++ {
			<-d.slots
		}
		if err != nil {
			if ctx.Err() == nil {
				d.stats.claimErrors.Add(1)
				log := d.cfg.Logger.WithError(err)
				if isDeadlock(err) {
					// InnoDB rolled the claim back whole: nothing to repair.
					log.Debug("outbox: claim lost a deadlock; retrying at the next poll")
				} else {
					log.Warn("outbox: claim failed; retrying at the next poll")
				}
			}
			return
		}
		for _, r := range rows {
			d.sends.Add(1)
			go d.send(sendCtx, r)
		}
		if len(rows) < n {
			return
		}
	}
}

func (d *Dispatcher) claim(ctx context.Context, n int) ([]claimedRow, error) {
	start := time.Now()
	token := d.cfg.Name + "." + randomSuffix()
	rows, err := d.q.claim(ctx, d.cfg.DB, token, n, d.cfg.LeaseDuration)
	if d.cfg.Metrics != nil {
		d.cfg.Metrics.OutboxClaimLatency.Observe(time.Since(start).Seconds())
	}
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, nil
	}
	// The rows are SENDING with our token and nothing is sent yet.
	failpoint.Inject(failpoint.AfterClaim)
	d.stats.claimed.Add(int64(len(rows)))
	for _, r := range rows {
		if r.tookOver {
			d.stats.tookOver.Add(1)
			metrics.Inc(d.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.OutboxLeaseExpired }, r.Destination)
			d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "previous_owner": r.OwnerToken.String}).
				Info("outbox: took over a row whose lease expired")
		}
	}
	return rows, nil
}

func (d *Dispatcher) send(sendCtx context.Context, r claimedRow) {
	defer d.sends.Done()
	defer d.Notify() // a slot is free and the aggregate's next version may be due
	defer func() { <-d.slots }()

	msg := &Message{Event: r.event(), Attempt: r.RetryCount + 1}
	out := Outcome{EventID: r.EventID, Destination: r.Destination, EventType: r.EventType, Attempt: msg.Attempt, TookOver: r.tookOver}
	ctx, cancel := context.WithTimeout(sendCtx, d.cfg.SendTimeout)
	err := d.safeSend(ctx, msg)
	cancel()
	if err == nil {
		// The receiver has the message; the row is not yet SENT. A crash here
		// resends it after the lease: consumers deduplicate.
		failpoint.Inject(failpoint.AfterSend)
	}
	log := d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "destination": r.Destination, "attempt": msg.Attempt})
	var n int64
	var merr error
	switch {
	case err == nil:
		out.Status = StatusSent
		n, merr = d.mark(func(ctx context.Context) (int64, error) { return d.q.markSent(ctx, d.cfg.DB, r.EventID, r.token) })
		if merr == nil && n == 1 {
			d.stats.sent.Add(1)
		}
		d.countSend(r, "success", "")
	case sendCtx.Err() != nil:
		// Shutdown cancelled the send: hand the row back without using a retry.
		out.Err = err
		out.Status = StatusPending
		if r.RetryCount > 0 {
			out.Status = StatusRetry
		}
		n, merr = d.mark(func(ctx context.Context) (int64, error) { return d.q.release(ctx, d.cfg.DB, r.EventID, r.token) })
		if merr == nil && n == 1 {
			d.stats.released.Add(1)
		}
	default:
		class := ClassOf(err)
		out.Err = err
		code := truncate(CodeOf(err), maxErrorCode)
		text := truncate(d.cfg.Redact(err.Error()), maxErrorMessage)
		if class == ClassPermanent || r.RetryCount >= d.cfg.MaxRetries {
			out.Status = StatusDead
			n, merr = d.mark(func(ctx context.Context) (int64, error) {
				return d.q.markDead(ctx, d.cfg.DB, r.EventID, r.token, code, text)
			})
			if merr == nil && n == 1 {
				d.stats.dead.Add(1)
				log.WithFields(logrus.Fields{"class": class.String(), "code": code, "retries": r.RetryCount}).
					Warn("outbox: row is DEAD: " + text)
			}
			d.countSend(r, "dead", class.String())
		} else {
			out.Status = StatusRetry
			out.RetryIn = Backoff(r.RetryCount, d.cfg.BackoffBase, d.cfg.BackoffMax)
			n, merr = d.mark(func(ctx context.Context) (int64, error) {
				return d.q.markRetry(ctx, d.cfg.DB, r.EventID, r.token, out.RetryIn, code, text)
			})
			if merr == nil && n == 1 {
				if class == ClassUnknown {
					d.stats.unknown.Add(1)
				} else {
					d.stats.retried.Add(1)
				}
			}
			result := "retry"
			if class == ClassUnknown {
				result = "unknown"
			}
			d.countSend(r, result, class.String())
		}
	}
	switch {
	case merr != nil:
		d.stats.markErrors.Add(1)
		log.WithError(merr).Warn("outbox: could not record the outcome; the row is resent after its lease expires")
	case n == 0:
		d.stats.lostLeases.Add(1)
		out.LostLease = true
		out.Status = ""
		log.Warn("outbox: lost the lease before recording the outcome; the new owner decides")
	}
	if d.cfg.OnOutcome != nil {
		d.cfg.OnOutcome(out)
	}
}

func (d *Dispatcher) safeSend(ctx context.Context, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = Transient(fmt.Errorf("outbox: sink panicked: %v", p))
		}
	}()
	return d.cfg.Sink.Send(ctx, m)
}

// mark writes an outcome on a context of its own (the send context may be
// cancelled by then), retrying a failed write twice.
func (d *Dispatcher) mark(f func(ctx context.Context) (int64, error)) (int64, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var n int64
		n, err = f(ctx)
		cancel()
		if err == nil {
			return n, nil
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return 0, err
}

func (d *Dispatcher) countSend(r claimedRow, result, class string) {
	metrics.Inc(d.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.OutboxSends },
		r.Destination, r.EventType, result, class)
}

func (d *Dispatcher) refreshLoop(ctx context.Context) {
	defer d.background.Done()
	t := time.NewTicker(d.cfg.MetricsInterval)
	defer t.Stop()
	for {
		d.refreshMetrics(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (d *Dispatcher) refreshMetrics(ctx context.Context) {
	b, err := d.table.Backlog(ctx, d.cfg.DB)
	if err != nil {
		if ctx.Err() == nil {
			d.cfg.Logger.WithError(err).Debug("outbox: backlog query failed")
		}
		return
	}
	m := d.cfg.Metrics
	m.OutboxPending.Reset()
	m.OutboxOldestAge.Reset()
	for _, x := range b {
		m.OutboxPending.WithLabelValues(x.Destination).Set(float64(x.Pending))
		m.OutboxOldestAge.WithLabelValues(x.Destination).Set(x.OldestAge.Seconds())
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// cut on a rune boundary
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n]
}

// isDeadlock reports MySQL error 1213 (deadlock, transaction rolled back)
// or 1205 (lock wait timeout).
func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}
