//go:build !failpoints

package clustersuite

import (
	"testing"

	"github.com/rmqtx/rmqtx/internal/failpoint"
)

// TestFailpointsNotCompiled keeps the package from reporting "no tests"
// in a build without the failpoints tag (the cluster tests need it; the
// fault suite prints the notice): it asserts that the tag really is off.
func TestFailpointsNotCompiled(t *testing.T) {
	if failpoint.Enabled {
		t.Fatal("notag_test.go is built together with the failpoints tag")
	}
}
