//go:build !failpoints

package clustersuite

import (
	"os"
	"testing"

	"github.com/rmqtx/rmqtx/internal/failpoint"
)

// TestFailpointsNotCompiled fails a full run built without the failpoints
// tag (see the fault suite's): the cluster tests need it. -short and
// RMQTX_NO_FAILPOINTS=1 accept their absence.
func TestFailpointsNotCompiled(t *testing.T) {
	if failpoint.Enabled {
		t.Fatal("notag_test.go is built together with the failpoints tag")
	}
	if testing.Short() || os.Getenv("RMQTX_NO_FAILPOINTS") == "1" {
		return
	}
	t.Fatal("rmqtx: the cluster suite is NOT compiled (it needs -tags failpoints); run it with `make test`" +
		" (set RMQTX_NO_FAILPOINTS=1 to run without it on purpose)")
}
