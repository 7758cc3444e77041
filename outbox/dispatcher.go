package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/shutdown"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/metrics"
)

// Dispatcher claims due outbox rows and sends them through a Sink. Any
// number of dispatchers, in one process or many, can serve one table.
//
// Inside, one goroutine claims and Config.Concurrency goroutines send. The
// claimer keeps a small buffer of claimed rows ahead of the senders, so a
// claim takes many rows at once and its round trips overlap the sends; the
// buffer is bounded so that a buffered row's send starts well inside its
// lease, and a row that waited too long anyway is handed back unsent.
//
// When the Sink is a BatchSink, each claim's rows are grouped by it, a
// sender sends one group per request, and the claim is held (held.go): its
// transaction keeps the rows locked while they are sent, and their outcomes
// are written in it, one write per row. Otherwise a claim writes its rows
// SENDING with an owner token and a lease, and one goroutine writes the
// SENT outcomes in batches, one UPDATE per owner token.
type Dispatcher struct {
	cfg   Config
	dl    dialect.Dialect // of cfg.DB, chosen at NewDispatcher
	table Table
	q     queries
	tr    *otelx.Tracer // nil: tracing off (tracing.go)

	wake  chan struct{} // Notify, and a batch of SENT marks written
	freed chan struct{} // a row finished: room to claim

	batch    BatchSink         // cfg.Sink when it sends batches; nil otherwise
	rowsCh   chan []claimedRow // claimed rows waiting for a sender, one send's worth each
	held     atomic.Int64      // claimed rows not yet finished (waiting or sending)
	maxWait  time.Duration     // longest a claimed row may wait for a sender; 0: no claim-ahead
	aheadMax int               // most rows claimed beyond Concurrency
	minClaim int               // fewest rows worth a claim while every sender is busy
	sendEst  atomic.Int64      // estimated duration of one send (ns); 0 until measured
	rescan   atomic.Bool       // an aggregate's next version may be claimable: scan PENDING from the start
	// heldClaims counts the held claims not yet committed (batch sinks).
	heldClaims atomic.Int64

	markMu     sync.Mutex
	groups     map[string]*markGroup // by owner token: the claims not yet fully recorded
	markSignal chan struct{}
	flushAfter time.Duration // longest a sent row waits for its claim's other rows

	mu          sync.Mutex
	started     bool
	closed      bool
	stopping    bool
	finished    chan struct{}
	stopLoop    context.CancelFunc
	stopSends   context.CancelFunc
	loopDone    chan struct{}
	stopWorkers chan struct{}
	workers     sync.WaitGroup
	stopMarker  chan struct{}
	markerDone  chan struct{}
	background  sync.WaitGroup

	stats struct {
		claimed, sent, retried, unknown, dead, tookOver, lostLeases, released, claimErrors, markErrors atomic.Int64
	}
}

// sentRow is a row whose send succeeded, waiting for its SENT update.
type sentRow struct {
	r   claimedRow
	out Outcome
}

// markGroup is one claim (one owner token) as the marker sees it.
type markGroup struct {
	left  int       // rows of the claim not yet finished
	rows  []sentRow // sent rows waiting for the SENT update
	first time.Time // when the oldest of rows was sent
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
	Released    int64 // rows handed back unsent (at shutdown, or after waiting too long for a sender)
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
	dl, err := dialect.For(cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("%w: DB: %w", ErrConfig, err)
	}
	d := &Dispatcher{
		cfg:        cfg,
		dl:         dl,
		table:      t,
		tr:         otelx.New(cfg.TracerProvider),
		q:          newQueries(dl, t.name),
		wake:       make(chan struct{}, 1),
		freed:      make(chan struct{}, 1),
		markSignal: make(chan struct{}, 1),
		groups:     map[string]*markGroup{},
		flushAfter: min(cfg.PollInterval, 10*time.Millisecond),
		// Up to two claims' worth of rows wait for a sender, so the next
		// claim runs while the senders work through the last one; while every
		// sender is busy, a claim waits until it can take half a batch.
		aheadMax: 2 * max(cfg.BatchSize, cfg.Concurrency),
		minClaim: max(1, cfg.BatchSize/2),
	}
	// A claimed row's lease must cover its wait for a sender, the send
	// (at most SendTimeout) and the outcome update (a tenth of the lease).
	// When SendTimeout leaves too little room, nothing is claimed ahead.
	margin := cfg.LeaseDuration / 10
	if w := cfg.LeaseDuration - cfg.SendTimeout - margin; w >= margin {
		d.maxWait = w
	} else {
		d.aheadMax = 0
	}
	// Rows, not groups, are bounded by held: a group holds at least one.
	d.rowsCh = make(chan []claimedRow, cfg.Concurrency+d.aheadMax)
	d.batch, _ = cfg.Sink.(BatchSink)
	d.q.stmts = stmtcache.New(cfg.DB)
	d.cfg.Logger = cfg.Logger.WithFields(logrus.Fields{"component": "outbox", "dispatcher": cfg.Name})
	return d, nil
}

// Name returns the dispatcher's name (the owner token prefix).
func (d *Dispatcher) Name() string { return d.cfg.Name }

// Start checks that the database answers a ping and, for a RocketMQSink,
// that a name server answers a request (see checkReachable; an error names
// the address and the cause and wraps ErrDatabaseUnreachable or
// ErrNameServerUnreachable, and the dispatcher stays unstarted), then
// begins polling and sending in background goroutines. Cancelling ctx
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
	if err := d.checkReachable(ctx); err != nil {
		return err
	}
	d.started = true
	loopCtx, stopLoop := context.WithCancel(ctx)
	sendCtx, stopSends := context.WithCancel(context.WithoutCancel(ctx))
	d.stopLoop, d.stopSends = stopLoop, stopSends
	d.loopDone = make(chan struct{})
	d.finished = make(chan struct{})
	d.stopWorkers = make(chan struct{})
	d.stopMarker = make(chan struct{})
	d.markerDone = make(chan struct{})
	d.workers.Add(d.cfg.Concurrency)
	for i := 0; i < d.cfg.Concurrency; i++ {
		go d.worker(sendCtx)
	}
	go d.marker()
	go d.loop(loopCtx)
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

// Shutdown stops claiming, hands back the claimed rows no sender has picked
// up yet (PENDING or RETRY, due at once, no retry used), and waits for the
// sends in flight and their outcomes. When ctx ends first, the sends are
// cancelled, their rows are handed back too and ctx's error is returned.
// Idempotent; safe without Start.
func (d *Dispatcher) Shutdown(ctx context.Context) error {
	d.mu.Lock()
	d.closed = true
	started, first := d.started, d.started && !d.stopping
	if started {
		d.stopping = true
	}
	d.mu.Unlock()
	if !started {
		return nil
	}
	if !first {
		select {
		case <-d.finished:
			return nil
		case <-ctx.Done():
			d.stopSends()
			<-d.finished
			return fmt.Errorf("outbox: shutdown: %w", ctx.Err())
		}
	}
	defer close(d.finished)
	d.stopLoop()
	select {
	case <-d.loopDone:
	case <-ctx.Done():
		d.stopSends()
		<-d.loopDone
	}
	d.background.Wait()
	// Nothing is claimed any more: hand back what no sender has taken.
	var left [][]claimedRow
	for drained := false; !drained; {
		select {
		case u := <-d.rowsCh:
			left = append(left, u)
		default:
			drained = true
		}
	}
	close(d.stopWorkers)
	d.releaseBuffered(left)
	done := make(chan struct{})
	go func() { d.workers.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		d.stopSends()
		<-done
		err = fmt.Errorf("outbox: shutdown: %w", ctx.Err())
	}
	// The senders are gone: write the last SENT outcomes.
	close(d.stopMarker)
	<-d.markerDone
	d.stopSends()
	d.q.stmts.Close()
	return err
}

// Close is Shutdown bounded by shutdown.DefaultCloseTimeout (30 s), the
// bound every rmqtx Close shares: sends in flight get that long to finish
// (each is bounded by SendTimeout), then they are cancelled and their rows
// handed back. To stop at once, call Shutdown with a cancelled context.
// Idempotent.
func (d *Dispatcher) Close() error { return shutdown.Close(d.Shutdown) }

// Stats returns the dispatcher's counters.
func (d *Dispatcher) Stats() Stats {
	s := &d.stats
	return Stats{
		Claimed: s.claimed.Load(), Sent: s.sent.Load(), Retried: s.retried.Load(), Unknown: s.unknown.Load(),
		Dead: s.dead.Load(), TookOver: s.tookOver.Load(), LostLeases: s.lostLeases.Load(),
		Released: s.released.Load(), ClaimErrors: s.claimErrors.Load(), MarkErrors: s.markErrors.Load(),
	}
}

// loop claims while rows are due and there is room: a wake-up (Notify, SENT
// marks written) or a poll makes rows due; a claim that comes back short
// means nothing more is due. Every claim looks for PENDING rows; expired
// leases and due RETRY rows are looked for once per PollInterval, and again
// on the next claim while the last look came back full.
func (d *Dispatcher) loop(ctx context.Context) {
	defer close(d.loopDone)
	ticker := time.NewTicker(d.cfg.PollInterval)
	defer ticker.Stop()
	due, sweepNow := true, true
	var lastSweep time.Time
	var more stepSet // steps that may have more due rows than they last took
	var resume any   // where the PENDING step resumes; nil: from the start
	for {
		if ctx.Err() != nil {
			return
		}
		if n := d.room(); due && n > 0 {
			sweep := sweepNow || time.Since(lastSweep) >= d.cfg.PollInterval
			steps := stepSet{stepExpired: sweep || more[stepExpired], stepRetry: sweep || more[stepRetry], stepPending: true}
			if sweep {
				sweepNow, lastSweep = false, time.Now()
			}
			if sweep || d.rescan.Swap(false) {
				// a poll looks at the whole range: rows committed late, or
				// heads whose predecessor is now SENT or DEAD, sit before resume
				resume = nil
			}
			res, err := d.claim(ctx, n, steps, resume)
			if err != nil {
				due, resume = false, nil
				if ctx.Err() == nil {
					d.stats.claimErrors.Add(1)
					log := d.cfg.Logger.WithError(err)
					if dialect.IsRetryable(d.dl, err) {
						// The database rolled the claim back whole (a
						// deadlock), or a lock wait gave up: nothing to repair.
						log.Debug("outbox: claim lost a deadlock; retrying at the next wake-up")
					} else {
						log.Warn("outbox: claim failed; retrying at the next wake-up")
					}
				}
				continue
			}
			resume = nil
			if res.full[stepPending] {
				resume = res.last // the backlog goes on: skip what this claim walked
			}
			for i, run := range steps {
				if run {
					// a step not reached (the batch filled first) may have due rows
					more[i] = !res.ran[i] || res.full[i]
				}
			}
			if len(res.rows) > 0 {
				var units [][]claimedRow
				if res.hold != nil {
					h := &heldClaim{tx: res.hold}
					for i := range res.rows {
						res.rows[i].hold = h
					}
					units = d.units(res.rows)
					h.left = len(units)
					d.heldClaims.Add(1)
				} else {
					d.markMu.Lock()
					d.groups[res.rows[0].token] = &markGroup{left: len(res.rows)}
					d.markMu.Unlock()
					units = d.units(res.rows)
				}
				d.held.Add(int64(len(res.rows)))
				for _, u := range units {
					d.rowsCh <- u // never blocks: held rows fit the channel
				}
			}
			due = len(res.rows) >= n
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-d.wake:
			due = true
		case <-d.freed:
		case <-ticker.C:
			due, sweepNow = true, true
		}
	}
}

// room returns how many rows the next claim may take, or 0 when it should
// wait: at most Concurrency plus the claim-ahead allowance may be held, and
// while every sender is busy a claim waits until it can take minClaim rows.
func (d *Dispatcher) room() int {
	if d.heldClaims.Load() >= maxHeldClaims {
		return 0 // a finishing claim frees a sender, which wakes the loop
	}
	held := int(d.held.Load())
	c := d.cfg.Concurrency
	free := c + d.ahead() - held
	if free <= 0 || (held >= c && free < d.minClaim) {
		return 0
	}
	return min(d.cfg.BatchSize, free)
}

// ahead is how many rows may wait for a sender beyond Concurrency: as many
// as the senders get through in half of maxWait at the estimated send
// duration, at most aheadMax. Before the first send, a send is assumed to
// take SendTimeout.
func (d *Dispatcher) ahead() int {
	if d.maxWait <= 0 {
		return 0
	}
	est := d.sendEst.Load()
	if est <= 0 {
		est = int64(d.cfg.SendTimeout)
	}
	a := int64(d.cfg.Concurrency) * int64(d.maxWait/2) / est
	return int(min(a, int64(d.aheadMax)))
}

// observeSend updates the send estimate: quick to rise, slow to fall.
func (d *Dispatcher) observeSend(took time.Duration) {
	t := max(int64(took), 1)
	for {
		old := d.sendEst.Load()
		est := t
		switch {
		case old == 0:
		case t > old:
			est = old + (t-old)/2
		default:
			est = old - (old-t)/8
		}
		if d.sendEst.CompareAndSwap(old, max(est, 1)) {
			return
		}
	}
}

func (d *Dispatcher) claim(ctx context.Context, n int, steps stepSet, from any) (claimResult, error) {
	start := time.Now()
	token := d.cfg.Name + "." + randomSuffix()
	var res claimResult
	var err error
	if d.batch != nil {
		res, err = d.q.claimHeld(ctx, d.cfg.DB, token, n, d.cfg.LeaseDuration, d.cfg.LeaseDuration, steps, from)
	} else {
		res, err = d.q.claimWith(ctx, d.cfg.DB, token, n, d.cfg.LeaseDuration, steps, from)
	}
	if d.cfg.Metrics != nil {
		d.cfg.Metrics.OutboxClaimLatency.Observe(time.Since(start).Seconds())
	}
	if err != nil || len(res.rows) == 0 {
		return res, err
	}
	// The rows are SENDING with our token (or locked by our open
	// transaction, held) and nothing is sent yet.
	failpoint.Inject(failpoint.AfterClaim)
	d.stats.claimed.Add(int64(len(res.rows)))
	for _, r := range res.rows {
		if r.tookOver {
			d.stats.tookOver.Add(1)
			metrics.Inc(d.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.OutboxLeaseExpired }, r.Destination)
			d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "previous_owner": r.OwnerToken.String}).
				Info("outbox: took over a row whose lease expired")
		}
	}
	return res, nil
}

// units splits one claim's rows into what a sender sends at once: groups
// of the BatchSink, or every row alone.
func (d *Dispatcher) units(rows []claimedRow) [][]claimedRow {
	if d.batch == nil || len(rows) < 2 {
		out := make([][]claimedRow, len(rows))
		for i := range rows {
			out[i] = rows[i : i+1 : i+1]
		}
		return out
	}
	msgs := make([]*Message, len(rows))
	index := make(map[*Message]int, len(rows))
	for i := range rows {
		msgs[i] = &Message{Event: rows[i].event(), Attempt: rows[i].RetryCount + 1}
		index[msgs[i]] = i
	}
	groups := d.safeBatches(msgs)
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

func (d *Dispatcher) safeBatches(msgs []*Message) (groups [][]*Message) {
	defer func() {
		if p := recover(); p != nil {
			d.cfg.Logger.Warnf("outbox: sink Batches panicked: %v; sending the rows one by one", p)
			groups = nil
		}
	}()
	return d.batch.Batches(msgs)
}

func (d *Dispatcher) worker(sendCtx context.Context) {
	defer d.workers.Done()
	for {
		select {
		case <-d.stopWorkers:
			return
		case u := <-d.rowsCh:
			d.sendUnit(sendCtx, u)
			d.held.Add(-int64(len(u)))
			select {
			case d.freed <- struct{}{}:
			default:
			}
		}
	}
}

// sendUnit sends one unit of a claim (a row alone, or one group of the
// BatchSink, all of one claim) in one request and settles each row's own
// outcome: in the held claim's transaction (settleHeld), or row by row with
// the successes left to the marker, which writes SENT in a batch.
func (d *Dispatcher) sendUnit(sendCtx context.Context, u []claimedRow) {
	msgs := make([]*Message, len(u))
	outs := make([]Outcome, len(u))
	logs := make([]logrus.FieldLogger, len(u))
	for i, r := range u {
		msgs[i] = &Message{Event: r.event(), Attempt: r.RetryCount + 1}
		outs[i] = Outcome{EventID: r.EventID, Destination: r.Destination, EventType: r.EventType, Attempt: msgs[i].Attempt, TookOver: r.tookOver}
		logs[i] = d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "destination": r.Destination, "attempt": msgs[i].Attempt})
	}
	// errs stays nil when the unit is not sent. Its rows were claimed at
	// the same instant, so the first one tells whether they waited too long.
	var errs []error
	if d.waitedTooLong(u[0]) {
		logs[0].WithField("rows", len(u)).Info("outbox: claimed rows waited too long for a sender; handed back unsent")
	} else {
		start := time.Now()
		if len(u) == 1 {
			ctx, sp := d.startDispatch(sendCtx, u[0], msgs[0])
			ctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
			err := d.safeSend(ctx, msgs[0])
			cancel()
			endDispatch(sp, err)
			errs = []error{err}
		} else {
			spans := d.startDispatchBatch(sendCtx, u, msgs)
			ctx, cancel := context.WithTimeout(sendCtx, d.cfg.SendTimeout)
			errs = d.safeSendBatch(ctx, msgs)
			cancel()
			endDispatchBatch(spans, errs)
		}
		if sendCtx.Err() == nil {
			d.observeSend(time.Since(start))
		}
	}
	if u[0].hold != nil {
		d.settleHeld(sendCtx, u, outs, errs, logs)
		return
	}
	for i, r := range u {
		if errs == nil {
			d.releaseOne(r, outs[i], logs[i])
			d.finishRow(r.token, nil)
			continue
		}
		d.finishRow(r.token, d.settle(sendCtx, r, outs[i], errs[i], logs[i]))
	}
}

// waitedTooLong: the row waited so long for a sender that its lease could
// end before the send does; it is handed back unsent instead.
func (d *Dispatcher) waitedTooLong(r claimedRow) bool {
	return d.maxWait > 0 && time.Since(r.claimedAt) > d.maxWait
}

func (d *Dispatcher) safeSendBatch(ctx context.Context, msgs []*Message) (errs []error) {
	defer func() {
		if p := recover(); p != nil {
			errs = nil
			err := d.sinkPanicked(p, msgs)
			for range msgs {
				errs = append(errs, err)
			}
		}
	}()
	errs = d.batch.SendBatch(ctx, msgs)
	if len(errs) != len(msgs) {
		// A sink that broke its contract: nothing is known to be delivered.
		err := Unknown(fmt.Errorf("outbox: sink returned %d results for %d messages", len(errs), len(msgs)))
		errs = make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// settle records the outcome of r's send (err), except a success: that it
// returns, for the marker to write SENT in a batch.
func (d *Dispatcher) settle(sendCtx context.Context, r claimedRow, out Outcome, err error, log logrus.FieldLogger) *sentRow {
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
		d.releaseOne(r, out, log)
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
func (d *Dispatcher) releaseOne(r claimedRow, out Outcome, log logrus.FieldLogger) {
	out.Status = releasedStatus(r)
	n, merr := d.mark(func(ctx context.Context) (int64, error) { return d.q.release(ctx, r.EventID, r.token) })
	if merr == nil && n == 1 {
		d.stats.released.Add(1)
	}
	d.record(out, n == 1, merr, log)
	d.Notify()
}

func releasedStatus(r claimedRow) Status {
	if r.RetryCount > 0 {
		return StatusRetry
	}
	return StatusPending
}

// record counts an outcome that was written (landed), lost to a new owner,
// or could not be written, and reports it to OnOutcome.
func (d *Dispatcher) record(out Outcome, landed bool, merr error, log logrus.FieldLogger) {
	switch {
	case merr != nil:
		d.stats.markErrors.Add(1)
		log.WithError(merr).Warn("outbox: could not record the outcome; the row is sent again (after its lease, if it has one)")
	case !landed:
		d.stats.lostLeases.Add(1)
		out.LostLease = true
		out.Status = ""
		log.Warn("outbox: lost the lease before recording the outcome; the new owner decides")
	}
	if d.cfg.OnOutcome != nil {
		d.cfg.OnOutcome(out)
	}
}

// finishRow tells the marker that a row of the claim token is finished:
// sent (s != nil, waiting for SENT) or recorded otherwise.
func (d *Dispatcher) finishRow(token string, s *sentRow) {
	d.markMu.Lock()
	g := d.groups[token]
	g.left--
	if s != nil {
		if len(g.rows) == 0 {
			g.first = time.Now()
		}
		g.rows = append(g.rows, *s)
	}
	signal := s != nil || g.left == 0
	if g.left == 0 && len(g.rows) == 0 {
		delete(d.groups, token)
	}
	d.markMu.Unlock()
	if signal {
		select {
		case d.markSignal <- struct{}{}:
		default:
		}
	}
}

// marker writes SENT for the rows the senders finish, one UPDATE per claim:
// when every row of the claim is finished, or when its oldest sent row has
// waited flushAfter, whichever comes first. At stop it writes what is left.
func (d *Dispatcher) marker() {
	defer close(d.markerDone)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	stop := false
	for {
		batch, next := d.takeReady(stop)
		if len(batch) > 0 {
			d.flushSent(batch)
			continue // more may have become ready meanwhile
		}
		if stop {
			return
		}
		var wait <-chan time.Time
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), 0)) // Go 1.23+: no stale tick to drain
			wait = timer.C
		}
		select {
		case <-d.markSignal:
		case <-wait:
		case <-d.stopMarker:
			stop = true // the senders are gone: write what is left and leave
		}
	}
}

// takeReady removes and returns the sent rows whose claim is finished or
// whose oldest row waited flushAfter (all of them when all is set), and
// returns when the next group becomes ready (zero: no group waits).
func (d *Dispatcher) takeReady(all bool) ([]sentRow, time.Time) {
	d.markMu.Lock()
	defer d.markMu.Unlock()
	now := time.Now()
	var batch []sentRow
	var next time.Time
	for token, g := range d.groups {
		if len(g.rows) == 0 {
			continue
		}
		due := g.first.Add(d.flushAfter)
		if all || g.left == 0 || !now.Before(due) {
			batch = append(batch, g.rows...)
			g.rows = nil
			if g.left == 0 {
				delete(d.groups, token)
			}
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return batch, next
}

func (d *Dispatcher) flushSent(batch []sentRow) {
	for _, g := range groupByToken(batch, func(s sentRow) claimedRow { return s.r }) {
		ids := make([]string, len(g))
		for i, s := range g {
			ids[i] = s.r.EventID
		}
		var landed map[string]bool
		_, merr := d.mark(func(ctx context.Context) (int64, error) {
			var err error
			landed, err = d.q.markSentMany(ctx, g[0].r.token, ids)
			return 0, err
		})
		for _, s := range g {
			out := s.out
			out.Status = StatusSent
			if merr == nil && landed[s.r.EventID] {
				d.stats.sent.Add(1)
				if s.r.AggregateType != "" {
					d.rescan.Store(true)
				}
			}
			d.record(out, landed[s.r.EventID], merr,
				d.cfg.Logger.WithFields(logrus.Fields{"event_id": s.r.EventID, "destination": s.r.Destination, "attempt": out.Attempt}))
		}
	}
	d.Notify() // the next versions of these rows' aggregates may be due
}

// releaseBuffered hands back, unsent, the units claimed ahead that no
// sender took (at shutdown): a held claim's rows need no write (its commit
// or rollback frees them); the others, one UPDATE per owner token.
func (d *Dispatcher) releaseBuffered(units [][]claimedRow) {
	var rows []claimedRow
	for _, u := range units {
		if u[0].hold == nil {
			rows = append(rows, u...)
			continue
		}
		outs := make([]Outcome, len(u))
		logs := make([]logrus.FieldLogger, len(u))
		for i, r := range u {
			outs[i] = Outcome{EventID: r.EventID, Destination: r.Destination, EventType: r.EventType,
				Attempt: r.RetryCount + 1, TookOver: r.tookOver}
			logs[i] = d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "destination": r.Destination})
		}
		d.settleHeld(context.Background(), u, outs, nil, logs)
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
			d.finishRow(r.token, nil)
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

func (d *Dispatcher) safeSend(ctx context.Context, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = d.sinkPanicked(p, []*Message{m})
		}
	}()
	return d.cfg.Sink.Send(ctx, m)
}

// sinkPanicked turns a sink's panic into the error of each message it was
// sending. The sink may have sent before it panicked, so the outcome is
// unknown, not transient: the row is retried (a resend carries the same
// event id, a duplicate consumers absorb) and counted as an unknown result in
// rmqtx_outbox_sends_total (settle). A panic is a bug in the sink: it is
// logged at Error with the event ids, never the payloads.
func (d *Dispatcher) sinkPanicked(p any, msgs []*Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.EventID
	}
	fields := logrus.Fields{"event_ids": ids, "code": codeSinkPanic}
	if len(msgs) == 1 {
		fields = logrus.Fields{"event_id": ids[0], "code": codeSinkPanic}
	}
	err := fmt.Errorf("outbox: sink panicked: %v", p)
	d.cfg.Logger.WithFields(fields).Error(d.cfg.Redact(err.Error()) + "; the outcome is unknown, the row is retried with the same event id")
	return NewSendError(ClassUnknown, codeSinkPanic, err)
}

// codeSinkPanic is the last_error_code of a send whose sink panicked.
const codeSinkPanic = "sink_panic"

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
