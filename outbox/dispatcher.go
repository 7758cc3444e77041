package outbox

import (
	"context"
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
// How a claim takes its rows and how their outcomes are written is the
// claim strategy (claimer). When the Sink is a BatchSink, each claim's rows
// are grouped by it, a sender sends one group per request, and the claim is
// held (held.go): its transaction keeps the rows locked while they are
// sent, and their outcomes are written in it, one write per row. Otherwise
// the claim is leased (lease.go): it writes its rows SENDING with an owner
// token and a lease, and the marker (marker.go) writes the SENT outcomes in
// batches, one UPDATE per owner token.
type Dispatcher struct {
	cfg   Config
	dl    dialect.Dialect // of cfg.DB, chosen at NewDispatcher
	table Table
	q     queries
	tr    *otelx.Tracer // nil: tracing off (tracing.go)

	wake  chan struct{} // Notify, and a batch of SENT marks written
	freed chan struct{} // a row finished: room to claim

	claims   claimer           // the claim strategy: held (held.go) or leased (lease.go)
	batch    BatchSink         // cfg.Sink when it sends batches (then claims is held); nil otherwise
	rowsCh   chan []claimedRow // claimed rows waiting for a sender, one send's worth each
	held     atomic.Int64      // claimed rows not yet finished (waiting or sending)
	maxWait  time.Duration     // longest a claimed row may wait for a sender; 0: no claim-ahead
	aheadMax int               // most rows claimed beyond Concurrency
	minClaim int               // fewest rows worth a claim while every sender is busy
	sendEst  atomic.Int64      // estimated duration of one send (ns); 0 until measured
	rescan   atomic.Bool       // an aggregate's next version may be claimable: scan PENDING from the start

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
	background  sync.WaitGroup

	stats struct {
		claimed, sent, retried, unknown, dead, tookOver, lostLeases, released, claimErrors, markErrors atomic.Int64
	}
}

// claimer is a claim strategy: how a claim takes its rows, how they are
// split into sends, and how their outcomes are written. NewDispatcher picks
// one by the Sink: heldClaimer (held.go) for a BatchSink, leaseClaimer
// (lease.go) otherwise. The claim loop, the senders and Shutdown go through
// it, so that each strategy's state stays in its own type.
type claimer interface {
	// claim takes up to n due head rows under token with the selected
	// steps, PENDING resuming at from (queries.lockDue).
	claim(ctx context.Context, token string, n int, steps stepSet, from any) (claimResult, error)
	// full reports that no claim may start now; a claim that finishes
	// wakes the loop.
	full() bool
	// units takes charge of a claim's rows (res.rows is not empty) and
	// splits them into units: what one sender sends in one request.
	units(res claimResult) [][]claimedRow
	// settle writes, or leaves to whoever writes them, the outcomes of one
	// unit: errs holds each row's send error, or is nil when the unit was
	// not sent (handed back unsent).
	settle(sendCtx context.Context, u []claimedRow, outs []Outcome, errs []error, logs []logrus.FieldLogger)
	// release hands back, unsent, units no sender took (at shutdown).
	release(units [][]claimedRow)
	// start and stop run the strategy's own goroutine, if it has one; stop
	// returns when it has written the outcomes the senders left.
	start()
	stop()
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
		cfg:   cfg,
		dl:    dl,
		table: t,
		tr:    otelx.New(cfg.TracerProvider),
		q:     newQueries(dl, t.name),
		wake:  make(chan struct{}, 1),
		freed: make(chan struct{}, 1),
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
	if d.batch != nil {
		d.claims = &heldClaimer{d: d}
	} else {
		d.claims = &leaseClaimer{d: d, m: newMarker(d, min(cfg.PollInterval, 10*time.Millisecond))}
	}
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
	d.workers.Add(d.cfg.Concurrency)
	for i := 0; i < d.cfg.Concurrency; i++ {
		go d.worker(sendCtx)
	}
	d.claims.start()
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
	d.claims.release(left)
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
	d.claims.stop()
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
				units := d.claims.units(res)
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
	if d.claims.full() {
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
	res, err := d.claims.claim(ctx, token, n, steps, from)
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

// oneByOne makes every row a unit of its own.
func oneByOne(rows []claimedRow) [][]claimedRow {
	out := make([][]claimedRow, len(rows))
	for i := range rows {
		out[i] = rows[i : i+1 : i+1]
	}
	return out
}

// releasedStatus is the status a row handed back unsent returns to:
// PENDING, or RETRY once it has failed before.
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
