package hasuite

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txproducer"
)

// LoadConfig describes a load.
type LoadConfig struct {
	Producers     []*txproducer.Producer // Sends go round robin over them
	Dispatcher    *outbox.Dispatcher     // notified after each outbox enqueue (may be nil)
	OutboxEvery   int                    // an outbox enqueue every N attempts (0: none)
	Workers       int                    // concurrent goroutines
	Limiter       *rate.Limiter          // nil: as fast as the workers go
	RollbackEvery int                    // every Nth attempt rolls back on purpose (0: 5)
	Stop          func(*Load) bool       // checked before each attempt
}

// Load runs transactional Sends (and every OutboxEvery-th an outbox
// enqueue) on several goroutines, paced by Limiter, until Stop says so or
// it is stopped. After an error a worker pauses (errorPause).
type Load struct {
	N    atomic.Int64 // attempts started
	OK   atomic.Int64 // Sends and enqueues that committed
	Errs atomic.Int64 // errors other than the rollbacks on purpose

	wg     sync.WaitGroup
	cancel context.CancelFunc
}

// StartLoad starts a load on the bed.
func (b *Bed) StartLoad(cfg LoadConfig) *Load {
	if cfg.RollbackEvery <= 0 {
		cfg.RollbackEvery = 5
	}
	pause := errorPause
	ctx, cancel := context.WithCancel(context.Background())
	l := &Load{cancel: cancel}
	for w := 0; w < cfg.Workers; w++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil && !cfg.Stop(l) {
				if cfg.Limiter != nil && cfg.Limiter.Wait(ctx) != nil {
					return
				}
				i := l.N.Add(1)
				rollback := i%int64(cfg.RollbackEvery) == 0
				var err error
				sctx, scancel := context.WithTimeout(ctx, 60*time.Second)
				if cfg.OutboxEvery > 0 && i%int64(cfg.OutboxEvery) == 1 {
					err = b.EnqueueOutbox(sctx, b.OutboxEvent("", "", 0), rollback, cfg.Dispatcher)
				} else {
					err = b.SendTx(sctx, cfg.Producers[int(i)%len(cfg.Producers)], rollback)
				}
				scancel()
				switch {
				case err == nil:
					l.OK.Add(1)
				case rollback && (errors.Is(err, txproducer.ErrLocalTx) || errors.Is(err, ErrBusiness)):
				default:
					l.Errs.Add(1)
					select {
					case <-ctx.Done():
					case <-time.After(pause):
					}
				}
			}
		}()
	}
	return l
}

// StopAndWait stops the workers and waits for the Sends in flight.
func (l *Load) StopAndWait() {
	l.cancel()
	l.wg.Wait()
}

// Finished waits up to timeout for the workers to stop by themselves (Stop
// said so) and reports whether they did.
func (l *Load) Finished(timeout time.Duration) bool {
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(timeout):
		return false
	}
}
