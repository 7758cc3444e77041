package outbox

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// sentRow is a row whose send succeeded, waiting for its SENT update.
type sentRow struct {
	r   claimedRow
	out Outcome
}

// marker writes SENT for the rows the lease strategy's senders sent
// (lease.go), one UPDATE per claim (owner token) instead of one per row: a
// claim's successes wait until every row of the claim is finished, or until
// the oldest has waited flushAfter. It runs in a goroutine of its own from
// Start until the senders are gone (stop), and then writes what is left.
type marker struct {
	d          *Dispatcher
	flushAfter time.Duration // longest a sent row waits for its claim's other rows

	mu     sync.Mutex
	groups map[string]*markGroup // by owner token: the claims not yet fully recorded
	signal chan struct{}         // a row finished

	quit chan struct{} // closed by stop: the senders are gone
	done chan struct{} // closed when run has written the last outcomes
}

func newMarker(d *Dispatcher, flushAfter time.Duration) *marker {
	return &marker{d: d, flushAfter: flushAfter, groups: map[string]*markGroup{}, signal: make(chan struct{}, 1)}
}

// start runs the marker's goroutine.
func (m *marker) start() {
	m.quit = make(chan struct{})
	m.done = make(chan struct{})
	go m.run()
}

// stop tells the marker that the senders are gone and waits until it has
// written the last SENT outcomes.
func (m *marker) stop() {
	close(m.quit)
	<-m.done
}

// begin registers a claim of n rows under token, before its rows go to the
// senders.
func (m *marker) begin(token string, n int) {
	m.mu.Lock()
	m.groups[token] = &markGroup{left: n}
	m.mu.Unlock()
}

// markGroup is one claim (one owner token) as the marker sees it.
type markGroup struct {
	left  int       // rows of the claim not yet finished
	rows  []sentRow // sent rows waiting for the SENT update
	first time.Time // when the oldest of rows was sent
}

// finishRow tells the marker that a row of the claim token is finished:
// sent (s != nil, waiting for SENT) or recorded otherwise.
func (m *marker) finishRow(token string, s *sentRow) {
	m.mu.Lock()
	g := m.groups[token]
	g.left--
	if s != nil {
		if len(g.rows) == 0 {
			g.first = time.Now()
		}
		g.rows = append(g.rows, *s)
	}
	signal := s != nil || g.left == 0
	if g.left == 0 && len(g.rows) == 0 {
		delete(m.groups, token)
	}
	m.mu.Unlock()
	if signal {
		select {
		case m.signal <- struct{}{}:
		default:
		}
	}
}

// run writes SENT for the rows the senders finish, one UPDATE per claim:
// when every row of the claim is finished, or when its oldest sent row has
// waited flushAfter, whichever comes first. At stop it writes what is left.
func (m *marker) run() {
	defer close(m.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	stop := false
	for {
		batch, next := m.takeReady(stop)
		if len(batch) > 0 {
			m.flushSent(batch)
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
		case <-m.signal:
		case <-wait:
		case <-m.quit:
			stop = true // the senders are gone: write what is left and leave
		}
	}
}

// takeReady removes and returns the sent rows whose claim is finished or
// whose oldest row waited flushAfter (all of them when all is set), and
// returns when the next group becomes ready (zero: no group waits).
func (m *marker) takeReady(all bool) ([]sentRow, time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var batch []sentRow
	var next time.Time
	for token, g := range m.groups {
		if len(g.rows) == 0 {
			continue
		}
		due := g.first.Add(m.flushAfter)
		if all || g.left == 0 || !now.Before(due) {
			batch = append(batch, g.rows...)
			g.rows = nil
			if g.left == 0 {
				delete(m.groups, token)
			}
			continue
		}
		if next.IsZero() || due.Before(next) {
			next = due
		}
	}
	return batch, next
}

// flushSent writes SENT for batch, one UPDATE per owner token, and records
// each row's outcome.
func (m *marker) flushSent(batch []sentRow) {
	d := m.d
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
