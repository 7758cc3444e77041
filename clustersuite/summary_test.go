//go:build failpoints

package clustersuite

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// scenario holds the figures of one test. The invariants it defends are
// lost = 0, ghosts = 0 and double effects = 0.
type scenario struct {
	Name       string
	Attempted  int // transactions (or outbox events) the test started
	Committed  int // committed per the database truth (txlog COMMITTED rows, outbox rows)
	RolledBack int // attempted and never committed (business rollback, fenced, failed)
	Consumed   int // distinct event ids with a business effect
	Lost       int // committed but not consumed (or Send said committed and the txlog disagrees)
	Ghosts     int // consumed (or answered COMMIT) but not committed
	DupAbsorb  int // dedup hits counted by the consumers (duplicates absorbed)
	DupDeliver int // raw duplicate deliveries seen by an independent collector
	Double     int // event ids with more than one business effect
	// Recover is the scenario's time to recover: from the moment the system
	// could start recovering (producer restarted, recovery started, broker
	// back, consumer joined) until everything owed was done.
	Recover  time.Duration
	Duration time.Duration
	Notes    []string
}

func (s *scenario) note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

type summary struct {
	mu         sync.Mutex
	scenarios  []*scenario
	servicesUp time.Duration
	restarts   []string // restarts that did not come back: a failure of their own kind
}

var report = &summary{}

func (r *summary) add(s *scenario) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scenarios = append(r.scenarios, s)
}

// restartFailed records a broker that was not usable again in time.
func (r *summary) restartFailed(service string, after time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restarts = append(r.restarts, fmt.Sprintf("%s not usable again after %s", service, after.Round(time.Second)))
}

// String is the summary in the fault suite's format, with a recover column.
func (r *summary) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.scenarios) == 0 && len(r.restarts) == 0 {
		return ""
	}
	sc := append([]*scenario(nil), r.scenarios...)
	sort.SliceStable(sc, func(i, j int) bool { return sc[i].Name < sc[j].Name })
	var b strings.Builder
	fmt.Fprintf(&b, "\n==== rmqtx cluster suite summary: two brokers (broker-a %s, broker-b %s), one name server ====\n", brokerA, brokerB)
	head := "%-18s %9s %9s %11s %8s %5s %6s %12s %13s %14s %8s %8s\n"
	row := "%-18s %9d %9d %11d %8d %5d %6d %12d %13d %14d %8s %8s\n"
	fmt.Fprintf(&b, head, "scenario", "attempted", "committed", "rolled_back", "consumed", "lost", "ghosts", "dup_absorbed", "dup_delivered", "double_effects", "recover", "took")
	var t scenario
	for _, s := range sc {
		recover := "-"
		if s.Recover > 0 {
			recover = s.Recover.Round(100 * time.Millisecond).String()
		}
		fmt.Fprintf(&b, row, s.Name, s.Attempted, s.Committed, s.RolledBack, s.Consumed, s.Lost, s.Ghosts, s.DupAbsorb, s.DupDeliver, s.Double,
			recover, s.Duration.Round(time.Second))
		t.Attempted += s.Attempted
		t.Committed += s.Committed
		t.RolledBack += s.RolledBack
		t.Consumed += s.Consumed
		t.Lost += s.Lost
		t.Ghosts += s.Ghosts
		t.DupAbsorb += s.DupAbsorb
		t.DupDeliver += s.DupDeliver
		t.Double += s.Double
	}
	fmt.Fprintf(&b, row, "TOTAL", t.Attempted, t.Committed, t.RolledBack, t.Consumed, t.Lost, t.Ghosts, t.DupAbsorb, t.DupDeliver, t.Double, "", "")
	for _, s := range sc {
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "  %s: %s\n", s.Name, n)
		}
	}
	for _, f := range r.restarts {
		fmt.Fprintf(&b, "  RESTART FAILED: %s\n", f)
	}
	verdict := "PASS"
	if t.Lost != 0 || t.Ghosts != 0 || t.Double != 0 || len(r.restarts) != 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "==== lost=%d ghosts=%d double_effects=%d restarts_failed=%d: %s ====\n", t.Lost, t.Ghosts, t.Double, len(r.restarts), verdict)
	return b.String()
}
