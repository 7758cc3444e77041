package workerpool

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stackOf returns a dump of the calling goroutine's stack.
func stackOf() string {
	b := make([]byte, 64<<10)
	return string(b[:runtime.Stack(b, false)])
}

// run calls p.Go(f) and waits for f to have run; it returns f's stack.
func run(t *testing.T, p *Pool) string {
	t.Helper()
	got := make(chan string, 1)
	p.Go(func() { got <- stackOf() })
	select {
	case s := <-got:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the function did not run")
		return ""
	}
}

// untilIdle waits until the worker goroutine id is parked in its select,
// waiting for a call: an idle worker takes Go's send at once. It reads
// every goroutine's stack and sends nothing. (It used to hand the worker a
// marker function and wait for it to run; the worker then had still to get
// back to its select, and a fresh-clone run once saw the next call start a
// second worker.)
func untilIdle(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	buf := make([]byte, 1<<20)
	for time.Now().Before(deadline) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			header, _, _ := strings.Cut(g, "\n")
			if strings.HasPrefix(header, "goroutine "+id+" [select") && strings.Contains(g, "workerpool.(*Pool).work") {
				return
			}
		}
		runtime.Gosched()
	}
	t.Fatalf("worker goroutine %s did not become idle", id)
}

func TestPoolRunsOnALongLivedWorker(t *testing.T) {
	p := New(2)
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	first := run(t, p)
	require.Contains(t, first, "workerpool.(*Pool).work", "the first call starts a worker")
	require.Equal(t, 1, p.Workers())
	untilIdle(t, goroutineID(first))
	second := run(t, p)
	require.Contains(t, second, "workerpool.(*Pool).work")
	require.Equal(t, goroutineID(first), goroutineID(second), "the second call runs on the same worker")
	require.Equal(t, 1, p.Workers(), "an idle worker serves the call: no second worker")
}

func TestPoolBeyondItsLimitRunsOnAGoroutineOfItsOwn(t *testing.T) {
	p := New(1)
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	hold, held := make(chan struct{}), make(chan struct{})
	p.Go(func() { close(held); <-hold }) // the one worker, busy
	<-held
	require.Equal(t, 1, p.Workers())
	s := run(t, p)
	require.NotContains(t, s, "workerpool.(*Pool).work", "no idle worker and the limit reached: a plain goroutine")
	require.Equal(t, 1, p.Workers())
	close(hold)
}

func TestPoolShutdownEndsItsWorkers(t *testing.T) {
	p := New(4)
	var wg sync.WaitGroup
	hold := make(chan struct{})
	for range 3 {
		wg.Add(1)
		p.Go(func() { wg.Done(); <-hold })
	}
	wg.Wait()
	require.Equal(t, 3, p.Workers())

	// Busy workers: Shutdown waits for them, bounded by its context.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := p.Shutdown(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.True(t, strings.HasPrefix(err.Error(), "workerpool: "), err.Error())

	close(hold)
	require.NoError(t, p.Shutdown(context.Background()), "idempotent; returns when the workers have ended")
	require.Equal(t, 0, p.Workers())

	// After Shutdown a call still runs, on a goroutine of its own.
	s := run(t, p)
	require.NotContains(t, s, "workerpool.(*Pool).work")
	require.Equal(t, 0, p.Workers())
}

func TestPoolManyCallersLoseNoCall(t *testing.T) {
	p := New(3)
	var ran sync.WaitGroup
	const calls = 2000
	ran.Add(calls)
	var callers sync.WaitGroup
	for range 8 {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for range calls / 8 {
				p.Go(ran.Done)
			}
		}()
	}
	callers.Wait()
	done := make(chan struct{})
	go func() { ran.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("not every call ran")
	}
	require.LessOrEqual(t, p.Workers(), 3)
	require.NoError(t, p.Shutdown(context.Background()))
	require.Equal(t, 0, p.Workers())
}

// goroutineID is the id in a stack dump's first line ("goroutine 7 [running]:").
func goroutineID(stack string) string {
	f := strings.Fields(stack)
	if len(f) < 2 {
		return ""
	}
	return f[1]
}
