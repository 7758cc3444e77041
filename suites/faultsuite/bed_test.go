//go:build failpoints

package faultsuite

import (
	"testing"

	"github.com/rmqtx/rmqtx/suites/internal/testbed"
)

// bed is one scenario's world (internal/testbed), with the fault suite's
// own helpers as methods.
type bed struct{ *testbed.Bed }

// newBedOn builds a scenario's world on the database server kind
// (testenv.DBMySQL, testenv.DBPostgres).
func newBedOn(t *testing.T, name, kind string) *bed { return &bed{suite.NewBedOn(t, name, kind)} }

// eachDB runs body once per database server as parallel subtests named
// after the server ("mysql", "postgres"), each with a bed of its own, so one
// test body proves the invariants on both and the summary shows each.
func eachDB(t *testing.T, name string, body func(t *testing.T, b *bed)) {
	t.Helper()
	suite.EachDB(t, name, func(t *testing.T, b *testbed.Bed, _ *testbed.Rendezvous) { body(t, &bed{b}) })
}

// eachDBShared is eachDB for a scenario whose fault exists once (a broker
// restart): the subtests share r, so the fault hits both beds at once.
func eachDBShared(t *testing.T, name string, body func(t *testing.T, b *bed, r *testbed.Rendezvous)) {
	t.Helper()
	suite.EachDB(t, name, func(t *testing.T, b *testbed.Bed, r *testbed.Rendezvous) { body(t, &bed{b}, r) })
}
