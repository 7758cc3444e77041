package broker

import (
	"context"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// Sentinels holds one idle TCP connection to each broker it watches and
// reports a broker whose connection closed: a broker that dies (a kill, a
// crash, a shutdown) closes it, so its owner learns at once instead of at
// its next poll. A broker never writes on such a connection; it closes one
// idle for 120 s (serverChannelMaxIdleTimeSeconds), which is reported too:
// the owner tells the two apart by dialling again (Accepts). A frozen or
// partitioned host keeps its connections open; owners poll as well.
type Sentinels struct {
	ctx     context.Context
	cancel  context.CancelFunc
	timeout time.Duration
	lost    chan string
	wg      sync.WaitGroup

	mu      sync.Mutex
	running map[string]bool
}

// NewSentinels returns an empty set; dial is the bound of one connect.
func NewSentinels(dial time.Duration) *Sentinels {
	ctx, cancel := context.WithCancel(context.Background())
	return &Sentinels{ctx: ctx, cancel: cancel, timeout: dial, lost: make(chan string, 16), running: map[string]bool{}}
}

// Lost delivers the address of each watched broker whose connection closed;
// it is no longer watched then.
func (s *Sentinels) Lost() <-chan string { return s.lost }

// Watch opens a sentinel to addr unless one runs. It reports false when the
// connection does not open (the broker is down).
func (s *Sentinels) Watch(addr string) bool {
	s.mu.Lock()
	if s.running[addr] || s.ctx.Err() != nil {
		ok := s.running[addr]
		s.mu.Unlock()
		return ok
	}
	s.mu.Unlock()
	dctx, cancel := context.WithTimeout(s.ctx, s.timeout)
	var d net.Dialer
	c, err := d.DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return false
	}
	s.mu.Lock()
	if s.running[addr] || s.ctx.Err() != nil {
		s.mu.Unlock()
		_ = c.Close()
		return true
	}
	s.running[addr] = true
	s.wg.Add(1)
	s.mu.Unlock()
	stop := context.AfterFunc(s.ctx, func() { _ = c.Close() })
	go func() {
		defer s.wg.Done()
		defer stop()
		var b [64]byte
		for {
			if _, err := c.Read(b[:]); err != nil {
				break
			}
		}
		_ = c.Close()
		s.mu.Lock()
		delete(s.running, addr)
		s.mu.Unlock()
		select {
		case s.lost <- addr:
		case <-s.ctx.Done():
		}
	}()
	return true
}

// Close closes every sentinel and waits for them. Idempotent.
func (s *Sentinels) Close() {
	s.cancel()
	s.wg.Wait()
}

// Accepts reports whether a TCP connection to addr opens within timeout
// (it is closed at once).
func Accepts(ctx context.Context, addr string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// masterWatch calls onChange when the set of the cluster's master brokers
// changes: a master died (its sentinel closed and it refuses connections),
// or the name server lists a master it did not list before (a promoted
// slave, a restarted or new broker). A push consumer uses it to read its
// routes and rebalance at once, instead of at the client's 30 s route
// refresh, so it pulls from a promoted master within a second or two.
type masterWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Intervals of masterWatch: the name-server poll while all is well, the
// poll while a master is gone and no change was seen yet, and how long
// that fast poll lasts.
const (
	masterPoll     = 2 * time.Second
	masterFastPoll = 500 * time.Millisecond
	masterFastFor  = 30 * time.Second
)

func watchMasters(nameServers []string, every time.Duration, onChange func()) *masterWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &masterWatch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sn := NewSentinels(3 * time.Second)
		defer sn.Close()
		var known []string // the masters of the last poll that answered
		haveKnown := false // known is a real answer (nil is one: no master)
		var fastUntil time.Time
		poll := func() {
			masters, err := remoting.ClusterMasters(ctx, nameServers, 3*time.Second)
			if err != nil {
				return
			}
			if haveKnown && !slices.Equal(known, masters) {
				if len(masters) > 0 {
					fastUntil = time.Time{} // the change is complete: a master is listed
				}
				onChange()
			}
			known, haveKnown = masters, true
			for _, a := range masters {
				sn.Watch(a)
			}
		}
		poll()
		t := time.NewTimer(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case a := <-sn.Lost():
				if Accepts(ctx, a, 3*time.Second) {
					sn.Watch(a) // closed for idleness
					continue
				}
				fastUntil = time.Now().Add(masterFastFor)
				poll()
			case <-t.C:
				poll()
			}
			next := every
			if time.Now().Before(fastUntil) && masterFastPoll < next {
				next = masterFastPoll
			}
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
			t.Reset(next)
		}
	}()
	return w
}

// stop ends the watch and waits for it. Idempotent; nil does nothing.
func (w *masterWatch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}
