package testenv

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// StaggeredSends runs send(i) once for each i in [0, n), each in its own
// goroutine; the goroutines are released together and sender i waits
// i*stagger before it sends, so the sends arrive spread over microseconds,
// as a service's first concurrent sends do. It returns how many failed and
// the first error. The route-race tests use it: a send that arrives while
// an earlier one is recording the topic's route is the one that meets the
// client's race (third_party/rocketmq-client-go/PATCHES.md, patch 9).
func StaggeredSends(n int, stagger time.Duration, send func(i int) error) (failed int, first error) {
	start := make(chan struct{})
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(time.Duration(i) * stagger) // the spread itself, not a wait for a condition
			errs <- send(i)
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			failed++
			if first == nil {
				first = err
			}
		}
	}
	return failed, first
}

// AwaitQueueCount waits until queue q of topic on the test bed's broker
// holds at least n messages, read from the broker itself (its max offset),
// and returns how many it holds then. The broker indexes a stored message
// into its queue a moment after it answered the send, so a count read at
// once may be short; the caller compares the result with what it expects,
// and a duplicate shows as more than n.
func AwaitQueueCount(t testing.TB, topic string, q int, n int64, timeout time.Duration) int64 {
	t.Helper()
	s := Integration(t)
	var stored int64
	Eventually(t, timeout, "messages indexed in the queue of "+topic, func() bool {
		var err error
		stored, err = remoting.MaxOffset(context.Background(), s.Broker, 5*time.Second, topic, q)
		if err != nil {
			t.Fatalf("testenv: max offset of %s queue %d: %v", topic, q, err)
		}
		return stored >= n
	})
	return stored
}
