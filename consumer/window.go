package consumer

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// Crash-count windows: what lets most first deliveries skip the count.
//
// The count before a handler (crash.go) exists for one case: a process that
// ended while a handler ran, whose message comes back looking like a first
// delivery. A message can come back that way only from its queue's
// committed offset, so it lies at or below the highest offset some process
// started a handler on. The window table keeps that offset per consumer
// group and queue (topic, broker, queue id), written before it is needed:
// a process commits high_offset = offset + windowSpan before it runs the
// first handler past the high offset it committed last (after reading the
// row, to see whether another process moved it): a read and an
// autocommitted write per windowSpan offsets of a queue instead of two
// statements per event.
//
// A first delivery then counts its attempt only when it is a suspect: at or
// below the high offset the window had when this process first read it (a
// process before this one may have been running it), or at or below a high
// offset that another process committed since (the queue was rebalanced
// away and back). Any other first delivery is covered: its process
// committed the window past it, so if that process ends while the handler
// runs, the next process finds the message at or below the window and
// counts it. The first crash of a message that was covered is therefore
// seen only as a window, not as an attempt: a handler that kills its
// process is parked after MaxRetries + 2 crashes, one more than when every
// attempt is counted. A message that crashes on a queue another process
// moved the window of in between may cost one more.
//
// Retried messages (ReconsumeTimes > 0, a %RETRY% queue) and messages that
// do not say where they came from (a Message built by the caller rather
// than MessageFromExt) are always counted, as is every delivery when the
// window cannot be read or written (the error is logged).
//
// After a restart or a rebalance, up to windowSpan offsets per queue (more
// while handlers were in flight) are suspects and counted: the price of the
// span. A topic recreated with offsets from 0 counts every delivery until
// its offsets pass the old window.

// windowSpan is how many offsets of a queue one window write covers.
const windowSpan = 128

// windowKey names a queue of one consumer group.
type windowKey struct {
	topic, broker string
	queue         int
}

// queueWindow is this process's view of one queue's window. mu is held
// across the window's reads and writes, so a delivery past covered waits
// for the write that covers it, never runs before it.
type queueWindow struct {
	mu     sync.Mutex
	loaded bool
	// suspectTo: offsets at or below it may have run in another process.
	suspectTo int64
	// covered: this process committed high_offset >= covered.
	covered int64
}

// windowSet holds the processor's queue windows (one per queue it was
// delivered from: bounded by the topic's queues).
type windowSet struct {
	mu sync.Mutex
	m  map[windowKey]*queueWindow
}

func (s *windowSet) get(k windowKey) *queueWindow {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[windowKey]*queueWindow{}
	}
	w, ok := s.m[k]
	if !ok {
		w = &queueWindow{}
		s.m[k] = w
	}
	return w
}

// windowSQL returns the window's read and its write (which only raises
// high_offset: two processes that both write it keep the higher).
func windowSQL(d dialect.Dialect, table string) (read, write string) {
	read = "SELECT high_offset FROM " + table + " WHERE consumer_group = ? AND topic = ? AND broker_name = ? AND queue_id = ?"
	write = d.Upsert(table, "consumer_group, topic, broker_name, queue_id, high_offset, updated_at",
		"?, ?, ?, ?, ?, "+d.Now(), "consumer_group, topic, broker_name, queue_id",
		"high_offset = CASE WHEN high_offset > "+d.Excluded("high_offset")+" THEN high_offset ELSE "+d.Excluded("high_offset")+" END, updated_at = "+d.Now())
	return d.Rebind(read), d.Rebind(write)
}

// windowed reports whether d places its message in a queue's window: a
// first delivery from a queue MessageFromExt named.
func windowed(d Delivery) (windowKey, bool) {
	if d.queueTopic == "" || d.BrokerName == "" || d.ReconsumeTimes > 0 || d.QueueOffset < 0 ||
		strings.HasPrefix(d.queueTopic, "%RETRY%") {
		return windowKey{}, false
	}
	return windowKey{topic: d.queueTopic, broker: d.BrokerName, queue: d.QueueID}, true
}

// covered reports whether ev's attempt is covered by its queue's window
// (no count before its handler), committing the window past it first when
// needed. False means: count it.
func (p *Processor) covered(ctx context.Context, ev Event) bool {
	k, ok := windowed(ev.Delivery)
	if !ok || p.windowsOff.Load() {
		return false
	}
	off := ev.Delivery.QueueOffset
	w := p.windows.get(k)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.loaded && off <= w.suspectTo {
		return false
	}
	if w.loaded && off <= w.covered {
		return true
	}
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	high, err := p.readWindow(bctx, k)
	if err != nil {
		p.windowFailed(ev, err, "consumer: cannot read the crash-count window; the attempt is counted")
		return false
	}
	if !w.loaded || high > w.covered {
		// Another process may have run handlers up to high: the first
		// read, or a write this process did not make.
		w.suspectTo, w.covered, w.loaded = high, high, true
		if high >= 0 {
			p.cfg.Logger.WithField("consumer_group", p.cfg.Group).WithField("topic", k.topic).WithField("broker", k.broker).
				WithField("queue_id", k.queue).WithField("high_offset", high).
				Debug("consumer: first deliveries up to the window's high offset count their attempts")
		}
		if off <= high {
			return false
		}
	}
	next := off + windowSpan
	if _, err := p.stmts.Exec(bctx, p.q.writeWindow, p.cfg.Group, k.topic, k.broker, k.queue, next); err != nil {
		p.windowFailed(ev, err, "consumer: cannot write the crash-count window; the attempt is counted")
		return false
	}
	w.covered = next
	return true
}

// windowFailed logs a failed read or write of ev's window. A missing table
// (a database the consumer's schema step 2 has not reached) turns the
// windows off for this processor, with one warning: every attempt is then
// counted, as before the windows.
func (p *Processor) windowFailed(ev Event, err error, msg string) {
	if p.d.IsMissingTable(err) {
		if !p.windowsOff.Swap(true) {
			p.cfg.Logger.WithField("consumer_group", p.cfg.Group).WithError(err).
				Warn("consumer: the crash-count window table is missing (migrate the consumer's schema: step 2); every attempt is counted")
		}
		return
	}
	p.cfg.Logger.WithFields(p.fields(ev)).WithError(err).Warn(msg)
}

// readWindow returns the queue's committed high offset, -1 without a row.
func (p *Processor) readWindow(ctx context.Context, k windowKey) (int64, error) {
	var high int64
	err := p.stmts.Get(ctx, &high, p.q.readWindow, p.cfg.Group, k.topic, k.broker, k.queue)
	if errors.Is(err, sql.ErrNoRows) {
		return -1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("consumer: read crash-count window: %w", err)
	}
	return high, nil
}
