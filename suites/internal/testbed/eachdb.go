package testbed

import (
	"testing"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// Databases are the servers every scenario runs on, in order: a scenario
// that runs on one only names it (NewBedOn) and says why in its doc.
var Databases = []string{testenv.DBMySQL, testenv.DBPostgres}

// EachDB runs body once per database server as parallel subtests named
// after the server ("mysql", "postgres"), each with a bed of its own, so
// one scenario proves the invariants on both and the summary shows each.
// The subtests share a Rendezvous (one party each, left when a subtest
// ends) for a fault that exists once, such as a broker kill: both beds are
// under it at the same moment. A scenario without such a fault ignores it.
func (s *Suite) EachDB(t *testing.T, name string, body func(t *testing.T, b *Bed, r *Rendezvous)) {
	t.Helper()
	r := NewRendezvous(len(Databases))
	for _, kind := range Databases {
		t.Run(kind, func(t *testing.T) {
			t.Cleanup(r.Leave) // first registered: runs after the bed's cleanups
			t.Parallel()
			body(t, s.NewBedOn(t, name, kind), r)
		})
	}
}
