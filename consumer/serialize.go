package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/wire"
)

// Order: the events of one routing key (wire.RoutingKey: the aggregate,
// else the business key) are applied one after another, in the order the
// consumer pulled them; events of other keys run in parallel as before.
//
// The push consumer consumes a queue concurrently: it starts one goroutine
// per handed-over batch, and goroutines start in any order, so the order a
// callback is entered in says nothing about the queue's order. The order is
// taken where the client still keeps it: the filter hook, which it runs on
// every pull result, in turn per queue, before it caches and hands over the
// messages. The hook gives each keyed message a ticket behind the previous
// ticket of its key; a message is applied only once that predecessor is
// done. Registration is one total order, so waiting never forms a cycle.
//
// A predecessor that fails (its outcome is a retry) holds back the tickets
// behind it, and those registered behind them, until its key has no ticket
// left: they are handed back for a redelivery with the same delay level,
// unprocessed, and arrive in the retry queue after it. A held-back event
// counts no attempt of its own, but its redelivery counts toward the
// broker's MaxReconsumeTimes backstop. So in-order delivery stays in order under failures
// this consumer sees.
//
// A strict version gap holds nothing back: it says the pull order is not
// the version order, and the version the gapped event waits for may be
// the very event behind it. Holding that one back behind the gap would
// re-form the same blocked chain on every redelivery (newest first stays
// newest first in the retry queue) until MaxWaits parks the head. The
// guard orders versioned events itself: a later, higher version behind a
// gap waits as a gap of its own. What it cannot hold is an event pulled later, after
// the failed one's key has drained: with VersionStrict (the default) that
// event waits for the missing version (a gap, bounded by MaxWaits); with
// VersionMonotonic it is applied, and the failed older event is then
// recorded STALE when its retry comes.
//
// A ticket whose message never reaches the callback (its queue was taken
// away by a rebalance after the pull) is dropped when the same queue is
// pulled again from an earlier offset, or when a waiter has waited
// strayAfter for it to be handed over.

// strayAfter is how long a waiter waits for a predecessor that was pulled
// but not handed to a callback. The client hands a queue's batches over in
// pull order, so a waiter's predecessor on the same queue is normally
// handed over before the waiter; only a dropped queue leaves one behind.
const strayAfter = 5 * time.Second

// errHeldBack is the error of an event handed back because an earlier
// event of its key failed.
var errHeldBack = errors.New("consumer: held back: an earlier event of the same key is being retried")

type ticket struct {
	key     string
	mq      broker.MessageQueue
	offset  int64
	prev    *ticket
	done    chan struct{}
	closed  bool // done is closed (under sequencer.mu)
	entered bool // handed to a callback (under sequencer.mu)
	at      time.Time
}

type keyLine struct {
	tail *ticket
	held int // > 0: an event failed; hold back the rest with this delay level
}

type sequencer struct {
	mu      sync.Mutex
	lines   map[string]*keyLine
	tickets map[*broker.MessageExt]*ticket
	pulled  map[broker.MessageQueue][]*ticket // not yet handed over, in pull order
	stop    chan struct{}
	stopped bool
	stray   time.Duration
}

func newSequencer() *sequencer {
	return &sequencer{
		lines:   map[string]*keyLine{},
		tickets: map[*broker.MessageExt]*ticket{},
		pulled:  map[broker.MessageQueue][]*ticket{},
		stop:    make(chan struct{}),
		stray:   strayAfter,
	}
}

// register records a pull result the shutdown gate let through
// (broker.PushConsumerConfig.OnPulled), in pull order.
func (s *sequencer) register(mq broker.MessageQueue, msgs []*broker.MessageExt) {
	if len(msgs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	// A pull from an offset at or below a message still waiting to be
	// handed over: the queue was dropped and taken again; those tickets
	// will never be handed over.
	first := msgs[0].QueueOffset
	var keep []*ticket
	for _, t := range s.pulled[mq] {
		switch {
		case t.entered || t.closed:
		case t.offset >= first:
			s.dropLocked(t)
		default:
			keep = append(keep, t)
		}
	}
	now := time.Now()
	for _, m := range msgs {
		// Three lookups, not GetProperties, which copies the whole map.
		key := wire.RoutingKey(m.GetProperty(wire.PropAggregateType), m.GetProperty(wire.PropAggregateID), m.GetProperty(wire.PropBusinessKey))
		if key == "" {
			continue
		}
		l := s.lines[key]
		if l == nil {
			l = &keyLine{}
			s.lines[key] = l
		}
		t := &ticket{key: key, mq: mq, offset: m.QueueOffset, prev: l.tail, done: make(chan struct{}), at: now}
		l.tail = t
		s.tickets[m] = t
		keep = append(keep, t)
	}
	if len(keep) == 0 {
		delete(s.pulled, mq)
	} else {
		s.pulled[mq] = keep
	}
}

// enter marks msgs handed over and returns their tickets (nil: no key, or
// pulled before the hook was installed: no order to keep).
func (s *sequencer) enter(msgs []*broker.MessageExt) []*ticket {
	out := make([]*ticket, len(msgs))
	if s == nil {
		return out
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range msgs {
		if t, ok := s.tickets[m]; ok {
			delete(s.tickets, m)
			if !t.closed {
				t.entered = true
				out[i] = t
			}
		}
	}
	return out
}

// turn waits until every earlier event of t's key is done. It returns the
// delay level to hand t back with (> 0) when one of them failed, or when
// the consumer is shutting down.
func (s *sequencer) turn(t *ticket) int {
	if t == nil {
		return 0
	}
	for p := t.prev; p != nil; {
		timer := time.NewTimer(s.stray)
		select {
		case <-p.done:
			timer.Stop()
			p = nil
		case <-s.stop:
			timer.Stop()
			return 1
		case <-timer.C:
			s.mu.Lock()
			if !p.entered && !p.closed {
				s.dropLocked(p) // pulled, never handed over: its queue was dropped
			}
			s.mu.Unlock()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lines[t.key]; l != nil && l.held > 0 {
		return l.held
	}
	return 0
}

// finish marks t done; failed > 0 (a retry's delay level) holds back the
// events behind it.
func (s *sequencer) finish(t *ticket, failed int) {
	if t == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lines[t.key]; l != nil && failed > 0 {
		l.held = max(l.held, failed)
	}
	s.closeLocked(t)
}

func (s *sequencer) dropLocked(t *ticket) {
	for m, x := range s.tickets {
		if x == t {
			delete(s.tickets, m)
			break
		}
	}
	s.closeLocked(t)
}

func (s *sequencer) closeLocked(t *ticket) {
	if t.closed {
		return
	}
	t.closed = true
	close(t.done)
	if l := s.lines[t.key]; l != nil && l.tail == t {
		delete(s.lines, t.key)
	}
}

// shutdown releases every waiter (they hand their events back) and
// registers nothing more.
func (s *sequencer) shutdown() {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.stopped {
		s.stopped = true
		close(s.stop)
	}
}

func heldBack(m Message, level int) Outcome {
	return Outcome{Result: ResultRetry, EventID: m.Properties[wire.PropEventID], Class: ClassWait, Err: errHeldBack, DelayLevel: level}
}

// failLevel is the delay level an outcome holds back the later events of
// its key with: 0 for an ACK, and for a version gap (see the Order comment).
func failLevel(o Outcome) int {
	if o.Ack() || errors.Is(o.Err, ErrVersionGap) {
		return 0
	}
	return max(o.DelayLevel, 1)
}

// consumeOrdered is consumeBatch with the order kept: each message waits
// for the earlier events of its key, and is held back when one failed.
func consumeOrdered(ctx context.Context, s *sequencer, process processFunc, rs resender, msgs []*broker.MessageExt) (broker.ConsumeResult, error) {
	ts := s.enter(msgs)
	outs := make([]Outcome, len(msgs))
	for i, m := range msgs {
		msg := MessageFromExt(m)
		if lvl := s.turn(ts[i]); lvl > 0 {
			outs[i] = heldBack(msg, lvl)
		} else {
			outs[i] = process(ctx, msg)
		}
		s.finish(ts[i], failLevel(outs[i]))
	}
	return settle(ctx, rs, msgs, outs)
}

// consumeTxBatchOrdered is consumeTxBatch with the order kept. The shared
// transaction runs in rounds: round r holds the r-th event of every key
// (and, in round 0, every event without a key), so no transaction holds
// two events of one key, and an event that fails holds back the later ones
// of its key instead of letting them apply. Before a round, each of its
// events waits for the earlier events of its key from other batches.
func consumeTxBatchOrdered(ctx context.Context, s *sequencer, p *Processor, rs resender, msgs []*broker.MessageExt) (broker.ConsumeResult, error) {
	ts := s.enter(msgs)
	outs := make([]Outcome, len(msgs))
	var rounds [][]int
	n := map[string]int{}
	for i, t := range ts {
		r := 0
		if t != nil {
			r = n[t.key]
			n[t.key]++
		}
		for len(rounds) <= r {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], i)
	}
	for _, round := range rounds {
		var run []int
		for _, i := range round {
			if lvl := s.turn(ts[i]); lvl > 0 {
				outs[i] = heldBack(MessageFromExt(msgs[i]), lvl)
				s.finish(ts[i], lvl)
				continue
			}
			run = append(run, i)
		}
		in := make([]Message, len(run))
		for k, i := range run {
			in[k] = MessageFromExt(msgs[i])
		}
		var res []Outcome
		if len(in) == 1 {
			res = []Outcome{p.Process(ctx, in[0])}
		} else if len(in) > 1 {
			res = p.ProcessBatch(ctx, in)
		}
		for k, i := range run {
			outs[i] = res[k]
			s.finish(ts[i], failLevel(res[k]))
		}
	}
	return settle(ctx, rs, msgs, outs)
}
