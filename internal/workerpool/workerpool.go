// Package workerpool runs short functions on long-lived goroutines, so that
// work which would otherwise start a goroutine per call runs on a stack
// that has already grown.
//
// A new goroutine starts with a small stack. A call chain through
// database/sql and a driver grows it two or three times, and each growth
// copies the stack: measured in rmqtx-bench, 10-13 µs of CPU per Send for
// txproducer's overlap goroutine (BEGIN and the txlog INSERT while the half
// message is in flight), which a hand-written producer, running its
// statements on its caller's goroutine, does not pay (BENCHMARKS.md). A
// worker's stack grows once and stays grown while it serves calls (the
// garbage collector may halve an idle worker's stack; the next call grows
// it once).
//
// Go never waits and never queues: a function runs on an idle worker, else
// on a new worker while fewer than the pool's limit exist, else on a plain
// goroutine of its own. So the pool adds no waiting and no ordering to its
// callers, whatever their concurrency. The functions must not panic (a
// panic ends the process, as it would on a plain goroutine).
package workerpool

import (
	"context"
	"fmt"
	"sync"
)

// Pool holds up to its limit of workers, idle or busy. The zero value is
// not usable; call New. Its methods are safe for concurrent use.
type Pool struct {
	jobs chan func()
	quit chan struct{}
	max  int

	mu      sync.Mutex // guards n and closed, and wg.Add against Shutdown
	n       int        // workers alive
	closed  bool
	wg      sync.WaitGroup
	closing sync.Once
}

// New returns a pool of at most limit workers (at least 1). Workers start on
// demand, on the first calls that find none idle, so an unused pool has no
// goroutine.
func New(limit int) *Pool {
	return &Pool{jobs: make(chan func()), quit: make(chan struct{}), max: max(limit, 1)}
}

// Go runs f on an idle worker, on a new worker while the pool has fewer
// than its limit, or on a new goroutine of its own. It returns at once,
// also after Shutdown (f then runs on a goroutine of its own).
func (p *Pool) Go(f func()) {
	select {
	case p.jobs <- f: // an idle worker took it
		return
	default:
	}
	p.mu.Lock()
	if p.closed || p.n >= p.max {
		p.mu.Unlock()
		go f()
		return
	}
	p.n++
	p.wg.Add(1)
	p.mu.Unlock()
	go p.work(f)
}

// work runs f, then serves calls until Shutdown.
func (p *Pool) work(f func()) {
	defer func() {
		p.mu.Lock()
		p.n--
		p.mu.Unlock()
		p.wg.Done()
	}()
	for {
		f()
		select {
		case f = <-p.jobs:
		case <-p.quit:
			return
		}
	}
}

// Workers reports how many workers are alive, busy or idle.
func (p *Pool) Workers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Shutdown ends the idle workers and waits, bounded by ctx, for the busy
// ones to finish their function and end. Calls to Go after it run on
// goroutines of their own. It is idempotent.
func (p *Pool) Shutdown(ctx context.Context) error {
	p.closing.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.quit)
	})
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("workerpool: shutdown: busy workers still running: %w", ctx.Err())
	}
}
