package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Op is one operation of a closed-loop run: worker is 0..concurrency-1,
// seq counts the operations started in the run.
type Op func(ctx context.Context, worker int, seq int64) error

// LoopResult is what a closed loop measured.
type LoopResult struct {
	Count     int64
	Errors    int64
	FirstErr  error
	Elapsed   time.Duration
	Latencies []time.Duration // successful operations, sorted
	// Measured, when set, are percentiles another process measured (a side
	// whose rounds it runs itself: javaside.go); Latencies is then empty.
	Measured *MeasuredLatency
}

// MeasuredLatency is p50, p99 and p99.9 in milliseconds, nearest rank as
// Percentile computes them.
type MeasuredLatency struct {
	P50Ms, P99Ms, P999Ms float64
}

// Round converts the result into a report round.
func (l LoopResult) Round(index int) Round {
	r := Round{Index: index, Count: l.Count, Errors: l.Errors, Seconds: l.Elapsed.Seconds()}
	if l.Elapsed > 0 {
		r.Rate = float64(l.Count) / l.Elapsed.Seconds()
	}
	if len(l.Latencies) > 0 {
		r.P50Ms = ms(Percentile(l.Latencies, 50))
		r.P99Ms = ms(Percentile(l.Latencies, 99))
		r.P999Ms = ms(Percentile(l.Latencies, 99.9))
	} else if m := l.Measured; m != nil {
		r.P50Ms, r.P99Ms, r.P999Ms = m.P50Ms, m.P99Ms, m.P999Ms
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// RunLoop runs op on concurrency goroutines, each starting its next operation
// as soon as the previous one returns (a closed loop), until d has passed
// (d > 0) or n operations have started (n > 0), or ctx ends. With both set,
// whichever comes first ends the run. Every operation is timed.
func RunLoop(ctx context.Context, concurrency int, d time.Duration, n int64, op Op) LoopResult {
	return RunLoopPaced(ctx, concurrency, d, n, 0, op)
}

// RunLoopPaced is RunLoop with the operations started at most perSecond a
// second, evenly spaced, across all goroutines (0: no cap). An operation's
// time does not include its wait for its turn. A rate that every side
// reaches makes the sides' CPU per operation comparable: on saturated cores
// a server's CPU per operation also follows how fast the side runs.
func RunLoopPaced(ctx context.Context, concurrency int, d time.Duration, n int64, perSecond float64, op Op) LoopResult {
	var lim *rate.Limiter
	if perSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(perSecond), 1)
	}
	if concurrency < 1 {
		concurrency = 1
	}
	var (
		seq      atomic.Int64
		count    atomic.Int64
		errs     atomic.Int64
		mu       sync.Mutex
		firstErr error
		lats     = make([][]time.Duration, concurrency)
		wg       sync.WaitGroup
	)
	start := time.Now()
	var deadline time.Time
	if d > 0 {
		deadline = start.Add(d)
	}
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			local := make([]time.Duration, 0, 1024)
			for ctx.Err() == nil {
				if !deadline.IsZero() && !time.Now().Before(deadline) {
					break
				}
				if lim != nil {
					if lim.Wait(ctx) != nil {
						break // ctx ended (or its deadline comes before the turn)
					}
					if !deadline.IsZero() && !time.Now().Before(deadline) {
						break // the turn came after the round's end
					}
				}
				s := seq.Add(1)
				if n > 0 && s > n {
					break
				}
				t0 := time.Now()
				err := op(ctx, w, s)
				lat := time.Since(t0)
				if err != nil {
					errs.Add(1)
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				count.Add(1)
				local = append(local, lat)
			}
			lats[w] = local
		}(w)
	}
	wg.Wait()
	res := LoopResult{Count: count.Load(), Errors: errs.Load(), FirstErr: firstErr, Elapsed: time.Since(start)}
	for _, l := range lats {
		res.Latencies = append(res.Latencies, l...)
	}
	slices.Sort(res.Latencies)
	return res
}
