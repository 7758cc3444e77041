package consumer

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker"
)

// goroutineID is the calling goroutine's id, from the first line of its
// stack ("goroutine N [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

// untilOnWorker delivers to c through w, each delivery answered with
// RetryLater, until one runs on a worker (c's delivery reports its
// goroutine on ran) rather than on caller: until a worker is parked
// waiting, deliveries run on the caller. It reports whether one did.
func untilOnWorker(t *testing.T, w *workers, c *Consumer, ran <-chan string, caller string) bool {
	t.Helper()
	for i := 0; i < 10000; i++ {
		res, err := w.deliver(context.Background(), c, nil)
		require.NoError(t, err)
		require.Equal(t, broker.ConsumeRetryLater, res)
		if <-ran != caller {
			return true
		}
		runtime.Gosched()
	}
	return false
}

// A Consumer that is shutting down answers a delivery with RetryLater
// without touching its Processor: the smallest delivery to hand a worker.
func closingConsumer() *Consumer {
	return &Consumer{closing: true}
}

// A delivery runs on an idle worker, not on the caller, and its answer
// comes back; the pool stops and waits for its workers.
func TestWorkersRunADeliveryOnAWorker(t *testing.T) {
	w := startWorkers(2)
	c := closingConsumer()
	caller := goroutineID()
	ran := make(chan string, 1)
	c.wrapDeliver = func() { ran <- goroutineID() }
	require.True(t, untilOnWorker(t, w, c, ran, caller), "a delivery ran on a worker")
	w.shutdown(true)
	w.shutdown(true) // idempotent
	// A stopped pool (and a nil one) runs the delivery on the caller.
	for _, p := range []*workers{w, nil} {
		res, err := p.deliver(context.Background(), c, nil)
		require.NoError(t, err)
		require.Equal(t, broker.ConsumeRetryLater, res)
		require.Equal(t, caller, <-ran)
	}
}

// With every worker busy, a delivery runs on the caller at once instead
// of waiting for one.
func TestWorkersBusyRunsOnTheCaller(t *testing.T) {
	w := startWorkers(1)
	defer w.shutdown(true)
	// Occupy the worker: a delivery that holds it until hold is closed
	// (until the worker is parked waiting, it runs on its caller instead:
	// try again).
	var hold chan struct{}
	var wg sync.WaitGroup
	held := false
	for i := 0; i < 10000 && !held; i++ {
		hold = make(chan struct{})
		h, ran, spawned := hold, make(chan string, 1), make(chan string, 1)
		busy := closingConsumer()
		busy.wrapDeliver = func() { ran <- goroutineID(); <-h }
		wg.Add(1)
		go func() {
			defer wg.Done()
			spawned <- goroutineID()
			_, _ = w.deliver(context.Background(), busy, nil)
		}()
		if held = <-spawned != <-ran; held {
			break // on the worker, held
		}
		close(h)
		wg.Wait()
		runtime.Gosched()
	}
	require.True(t, held, "a delivery holds the only worker")
	c := closingConsumer()
	caller := goroutineID()
	ran := make(chan string, 1)
	c.wrapDeliver = func() { ran <- goroutineID() }
	_, err := w.deliver(context.Background(), c, nil)
	require.NoError(t, err)
	require.Equal(t, caller, <-ran, "no idle worker: the caller ran it")
	close(hold)
	wg.Wait()
}

// A panic on a worker is raised again on the caller's goroutine (where the
// client recovers callbacks), and the worker goes on serving.
func TestWorkersCarryAPanicBack(t *testing.T) {
	w := startWorkers(1)
	defer w.shutdown(true)
	c := closingConsumer()
	caller := goroutineID()
	where := ""
	c.wrapDeliver = func() {
		if where = goroutineID(); where != caller {
			panic("boom")
		}
	}
	// Until the worker is parked waiting, deliveries run on the caller.
	for i := 0; i < 10000 && where != caller+"x"; i++ {
		func() {
			defer func() {
				if r := recover(); r != nil {
					require.Equal(t, "boom", r)
					where = caller + "x" // raised on the caller
				}
			}()
			_, _ = w.deliver(context.Background(), c, nil)
		}()
		runtime.Gosched()
	}
	require.Equal(t, caller+"x", where, "the worker's panic was raised on the caller")
	// The same worker serves the next delivery.
	ran := make(chan string, 1)
	c.wrapDeliver = func() { ran <- goroutineID() }
	require.True(t, untilOnWorker(t, w, c, ran, caller), "the worker serves again after a panic")
}

// A delivery that calls runtime.Goexit on a worker (a test's FailNow in a
// handler) ends its caller's goroutine too, unanswered, as it did on the
// client's goroutine: it is never mistaken for an answer (an ACK).
func TestWorkersCarryAGoexitBack(t *testing.T) {
	w := startWorkers(1)
	defer w.shutdown(true)
	c := closingConsumer()
	onWorker := false
	for i := 0; i < 10000 && !onWorker; i++ {
		answered, spawned := make(chan bool, 1), make(chan string, 1)
		ran := make(chan string, 1)
		c.wrapDeliver = func() { ran <- goroutineID(); runtime.Goexit() }
		done := make(chan struct{})
		go func() {
			defer close(done)
			spawned <- goroutineID()
			_, _ = w.deliver(context.Background(), c, nil)
			answered <- true
		}()
		<-done
		onWorker = <-spawned != <-ran
		require.Empty(t, answered, "a delivery that exited got no answer")
		runtime.Gosched()
	}
	require.True(t, onWorker, "a delivery exited on a worker")
}
