//go:build failpoints

package faultsuite

import (
	"testing"

	"github.com/rmqtx/rmqtx/internal/testbed"
)

// bed is one scenario's world (internal/testbed), with the fault suite's
// own helpers as methods.
type bed struct{ *testbed.Bed }

func newBed(t *testing.T, name string) *bed { return &bed{suite.NewBed(t, name)} }
