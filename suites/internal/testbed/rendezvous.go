package testbed

import "sync"

// Rendezvous lets the subtests of one scenario (one per database) share a
// fault that exists once: a broker killed once hits the MariaDB bed and the
// PostgreSQL bed at the same moment, so the scenario runs on both databases
// for the price of one kill and one restart. Each subtest calls Step at the
// same points of its body; the last party to arrive runs the step, and
// every party returns once it ran. A party that ends early (a failed
// require) calls Leave (see Join), so the others never wait for it.
type Rendezvous struct {
	mu      sync.Mutex
	cond    *sync.Cond
	parties int
	arrived int
	phase   int
	running bool
	ok      bool
}

// NewRendezvous returns a rendezvous of n parties.
func NewRendezvous(n int) *Rendezvous {
	r := &Rendezvous{parties: n}
	r.cond = sync.NewCond(&r.mu)
	return r
}

// Step waits until every party still in arrived at this step, runs step in
// the last one to arrive, and reports whether step returned (false when it
// ended its goroutine: a t.Fatal in the party that ran it). Every party
// sees the same answer.
func (r *Rendezvous) Step(step func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	phase := r.phase
	r.arrived++
	for r.phase == phase {
		if !r.running && r.arrived >= r.parties {
			r.running = true
			ok := false
			func() {
				r.mu.Unlock()
				defer func() {
					// Runs on a runtime.Goexit too: the others are released.
					r.mu.Lock()
					r.running, r.ok = false, ok
					r.arrived = 0
					r.phase++
					r.cond.Broadcast()
				}()
				step()
				ok = true
			}()
			return ok
		}
		r.cond.Wait()
	}
	return r.ok
}

// Leave takes a party out: the steps to come no longer wait for it.
func (r *Rendezvous) Leave() {
	r.mu.Lock()
	r.parties--
	r.cond.Broadcast()
	r.mu.Unlock()
}
