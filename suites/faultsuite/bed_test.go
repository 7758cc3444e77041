//go:build failpoints

package faultsuite

import (
	"testing"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
)

// bed is one scenario's world (internal/testbed), with the fault suite's
// own helpers as methods.
type bed struct{ *testbed.Bed }

// newBedOn builds a scenario's world on the database server kind
// (testenv.DBMySQL, testenv.DBPostgres).
func newBedOn(t *testing.T, name, kind string) *bed { return &bed{suite.NewBedOn(t, name, kind)} }

// databases are the servers eachDB runs a scenario on, in order.
var databases = []string{testenv.DBMySQL, testenv.DBPostgres}

// eachDB runs body once per database server as parallel subtests named
// after the server ("mysql", "postgres"), each with a bed of its own, so one
// test body proves the invariants on both and the summary shows each.
func eachDB(t *testing.T, name string, body func(t *testing.T, b *bed)) {
	t.Helper()
	for _, kind := range databases {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			body(t, newBedOn(t, name, kind))
		})
	}
}
