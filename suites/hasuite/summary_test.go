package hasuite

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"
)

// Scenario holds the figures of one test. The invariants it defends are
// lost = 0, ghosts = 0 and double effects = 0; a scenario counts only once
// Verify has run to its end (Verified) with a positive Committed.
type Scenario struct {
	Name string
	// DB is the database server the scenario ran on (testenv.DBMySQL,
	// testenv.DBPostgres): the summary reports each database on its own.
	DB         string
	Attempted  int // transactions (or published events) the test started; markers not included
	Committed  int // committed per the database truth (txlog COMMITTED rows, outbox rows)
	RolledBack int // attempted and never committed (business rollback, fenced, failed)
	Consumed   int // distinct event ids with a business effect
	Lost       int // committed but not consumed (or Send said committed and the txlog disagrees)
	Ghosts     int // consumed (or answered COMMIT) but not committed
	DupAbsorb  int // dedup hits counted by the consumers (duplicates absorbed)
	DupDeliver int // raw duplicate deliveries seen by an independent collector
	Double     int // event ids with more than one business effect
	// StoredTwice counts the committed events that the independent
	// collector received as more than one stored message (distinct broker,
	// queue and offset): broker re-stores after a re-check, republishes by
	// recovery, outbox re-sends. A figure, not an invariant: consumers
	// absorb the copies, and how many there are depends on broker settings.
	StoredTwice int
	// Markers is the number of markers Verify sent after convergence.
	Markers int
	// Recover is the scenario's time to recover: from the moment the system
	// could start recovering (producer restarted, recovery started, broker
	// back, consumer joined) until everything owed was done (0: not measured).
	Recover  time.Duration
	Duration time.Duration
	Notes    []string
	// Verified says that Verify ran to its end: convergence, markers,
	// comparison and every assertion.
	Verified bool
}

// Label names the scenario and its database, as the summary's notes do.
func (s *Scenario) Label() string {
	if s.DB == "" {
		return s.Name
	}
	return s.Name + " (" + s.DB + ")"
}

// Note adds a line to the scenario's notes in the summary.
func (s *Scenario) Note(format string, args ...any) {
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// Summary is the table printed after a suite's run.
type Summary struct {
	// Title returns the heading (the suite and its mode).
	Title func() string

	mu         sync.Mutex
	scenarios  []*Scenario
	servicesUp time.Duration
	restarts   []string // restarts that did not come back: a failure of their own kind
	exitCode   int      // go test's result for the whole run
}

// Add records a scenario (a bed does it when its test ends).
func (r *Summary) Add(s *Scenario) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.scenarios = append(r.scenarios, s)
}

// String is the table (one row per scenario and database, a total per
// database, a total of all), the notes, and a verdict line that gives lost,
// ghosts and double effects per database, then for the whole run. The
// verdict is PASS only when lost, ghosts and double effects are 0, every
// restart came back, the tests passed, and every scenario reached the end
// of Verify with a positive number of committed events: a scenario that
// died before its verification proves nothing.
func (r *Summary) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.scenarios) == 0 && len(r.restarts) == 0 {
		return ""
	}
	sc := append([]*Scenario(nil), r.scenarios...)
	sort.SliceStable(sc, func(i, j int) bool {
		if sc[i].Name != sc[j].Name {
			return sc[i].Name < sc[j].Name
		}
		return sc[i].DB < sc[j].DB
	})
	var b strings.Builder
	title := "rmqtx suite summary"
	if r.Title != nil {
		title = r.Title()
	}
	fmt.Fprintf(&b, "\n==== %s ====\n", title)
	head := "%-18s %-8s %9s %9s %11s %8s %5s %6s %12s %13s %14s %8s %8s %8s\n"
	row := "%-18s %-8s %9d %9d %11d %8d %5d %6d %12d %13d %14d %8d %8s %8s\n"
	fmt.Fprintf(&b, head, "scenario", "db", "attempted", "committed", "rolled_back", "consumed", "lost", "ghosts", "dup_absorbed", "dup_delivered", "double_effects", "stored>1", "recover", "took")
	var t Scenario
	perDB := map[string]*Scenario{}
	var dbs []string
	var unverified, empty []string
	add := func(t, s *Scenario) {
		t.Attempted += s.Attempted
		t.Committed += s.Committed
		t.RolledBack += s.RolledBack
		t.Consumed += s.Consumed
		t.Lost += s.Lost
		t.Ghosts += s.Ghosts
		t.DupAbsorb += s.DupAbsorb
		t.DupDeliver += s.DupDeliver
		t.Double += s.Double
		t.StoredTwice += s.StoredTwice
	}
	for _, s := range sc {
		recover := "-"
		if s.Recover > 0 {
			recover = s.Recover.Round(100 * time.Millisecond).String()
		}
		db := s.DB
		if db == "" {
			db = "-"
		}
		fmt.Fprintf(&b, row, s.Name, db, s.Attempted, s.Committed, s.RolledBack, s.Consumed, s.Lost, s.Ghosts, s.DupAbsorb, s.DupDeliver, s.Double,
			s.StoredTwice, recover, s.Duration.Round(time.Second))
		add(&t, s)
		if perDB[db] == nil {
			perDB[db] = &Scenario{}
			dbs = append(dbs, db)
		}
		add(perDB[db], s)
		switch {
		case !s.Verified:
			unverified = append(unverified, s.Label())
		case s.Committed <= 0:
			empty = append(empty, s.Label())
		}
	}
	sort.Strings(dbs)
	if len(dbs) > 1 {
		for _, db := range dbs {
			d := perDB[db]
			fmt.Fprintf(&b, row, "TOTAL", db, d.Attempted, d.Committed, d.RolledBack, d.Consumed, d.Lost, d.Ghosts, d.DupAbsorb, d.DupDeliver, d.Double, d.StoredTwice, "", "")
		}
	}
	fmt.Fprintf(&b, row, "TOTAL", "all", t.Attempted, t.Committed, t.RolledBack, t.Consumed, t.Lost, t.Ghosts, t.DupAbsorb, t.DupDeliver, t.Double, t.StoredTwice, "", "")
	b.WriteString("  (stored>1: committed events an independent consumer received as more than one stored message; reported, not asserted)\n")
	for _, s := range sc {
		for _, n := range s.Notes {
			fmt.Fprintf(&b, "  %s: %s\n", s.Label(), n)
		}
	}
	for _, f := range r.restarts {
		fmt.Fprintf(&b, "  RESTART FAILED: %s\n", f)
	}
	for _, n := range unverified {
		fmt.Fprintf(&b, "  NOT VERIFIED: %s ended before its verification finished\n", n)
	}
	for _, n := range empty {
		fmt.Fprintf(&b, "  NOTHING COMMITTED: %s\n", n)
	}
	if r.exitCode != 0 {
		fmt.Fprintf(&b, "  TESTS FAILED: go test exit status %d\n", r.exitCode)
	}
	for _, db := range dbs {
		d := perDB[db]
		fmt.Fprintf(&b, "==== %s: lost=%d ghosts=%d double_effects=%d stored_more_than_once=%d ====\n", db, d.Lost, d.Ghosts, d.Double, d.StoredTwice)
	}
	verdict := "PASS"
	if t.Lost != 0 || t.Ghosts != 0 || t.Double != 0 || len(r.restarts) != 0 || len(unverified) != 0 || len(empty) != 0 || r.exitCode != 0 {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "==== lost=%d ghosts=%d double_effects=%d stored_more_than_once=%d restarts_failed=%d unverified=%d: %s ====\n",
		t.Lost, t.Ghosts, t.Double, t.StoredTwice, len(r.restarts), len(unverified)+len(empty), verdict)
	return b.String()
}
