package consumer

import (
	"context"
	"runtime"
	"sync"

	"github.com/rmqtx/rmqtx/internal/broker"
)

// Deliveries run on long-lived worker goroutines.
//
// The client starts a new goroutine for every delivery, with a small
// stack, and a delivery's call chain (the Processor, database/sql, the
// driver) is deep enough to grow it two or three times: each growth copies
// the stack. Measured in the bench, that was 5-10 µs of CPU per message,
// on the raw client's handlers as on rmqtx's (BENCHMARKS.md). A worker's
// stack grows once and stays grown while it serves deliveries (the
// garbage collector may halve an idle worker's stack; the next delivery
// grows it once). The client's goroutine hands the delivery over and waits
// for its answer, so the client still sees one callback per delivery, in
// flight until the answer: the stop gate and Shutdown count it the same.
//
// A delivery that finds no idle worker runs on the client's goroutine, as
// before: a worker never queues a delivery behind another. A panic in a
// worker is carried back and raised again on the client's goroutine, where
// the client recovers callbacks; so is a runtime.Goexit (a test's FailNow
// in a handler): the client's goroutine then exits unanswered, as before,
// and the delivery is not acknowledged.

// workers is the pool; a nil *workers runs every delivery on the caller.
type workers struct {
	jobs chan *job
	quit chan struct{}
	wg   sync.WaitGroup
	stop sync.Once
}

// job is one delivery handed to a worker.
type job struct {
	c    *Consumer
	ctx  context.Context
	msgs []*broker.MessageExt

	res      broker.ConsumeResult
	err      error
	panicked any
	exited   bool          // the delivery called runtime.Goexit
	done     chan struct{} // one token per job: the worker is done with it
}

var jobs = sync.Pool{New: func() any { return &job{done: make(chan struct{}, 1)} }}

// startWorkers starts n workers.
func startWorkers(n int) *workers {
	w := &workers{jobs: make(chan *job), quit: make(chan struct{})}
	w.wg.Add(n)
	for range n {
		go w.work()
	}
	return w
}

func (w *workers) work() {
	defer w.wg.Done()
	for {
		select {
		case j := <-w.jobs:
			j.run()
		case <-w.quit:
			return
		}
	}
}

func (j *job) run() {
	returned := false
	defer func() {
		if !returned {
			// A panic (recovered here: the worker goes on serving), or
			// runtime.Goexit (recover returns nil: the worker exits too,
			// and the pool has one fewer).
			if j.panicked = recover(); j.panicked == nil {
				j.exited = true
			}
		}
		j.done <- struct{}{}
	}()
	j.res, j.err = j.c.deliver(j.ctx, j.msgs)
	returned = true
}

// deliver runs c.deliver for msgs on an idle worker, else on the caller.
func (w *workers) deliver(ctx context.Context, c *Consumer, msgs []*broker.MessageExt) (broker.ConsumeResult, error) {
	if w == nil {
		return c.deliver(ctx, msgs)
	}
	j := jobs.Get().(*job)
	j.c, j.ctx, j.msgs = c, ctx, msgs
	select {
	case w.jobs <- j:
	default:
		j.c, j.ctx, j.msgs = nil, nil, nil
		jobs.Put(j)
		return c.deliver(ctx, msgs)
	}
	<-j.done
	res, err, p, exited := j.res, j.err, j.panicked, j.exited
	*j = job{done: j.done}
	jobs.Put(j)
	switch {
	case p != nil:
		panic(p)
	case exited:
		runtime.Goexit()
	}
	return res, err
}

// shutdown stops the workers; wait also waits until each has returned
// (only when no delivery can still be running on one). Idempotent.
func (w *workers) shutdown(wait bool) {
	if w == nil {
		return
	}
	w.stop.Do(func() { close(w.quit) })
	if wait {
		w.wg.Wait()
	}
}
