//go:build !failpoints

package faultsuite

import (
	"os"
	"testing"

	"github.com/rmqtx/rmqtx/internal/failpoint"
)

// notice is what a `go test ./...` without -tags failpoints did not run: the
// whole fault suite here, the cluster suite, and the crash tests of
// txproducer, outbox, consumer and discard, which compile only with the tag.
const notice = "rmqtx: crash and fault-injection tests NOT compiled (they need -tags failpoints); " +
	"run them with `make test` or `go test -race -tags failpoints ./...`"

// TestFailpointsNotCompiled fails a full run built without the failpoints
// tag, so the missing suites are reported on every platform and on every
// run: a failure is never served from go test's cache, and go test always
// prints it. A -short run (unit tests only, `make test-short`) does not need
// the crash suites and passes; RMQTX_NO_FAILPOINTS=1 accepts their absence
// on purpose.
func TestFailpointsNotCompiled(t *testing.T) {
	if failpoint.Enabled {
		t.Fatal("notag_test.go is built together with the failpoints tag")
	}
	if testing.Short() || os.Getenv("RMQTX_NO_FAILPOINTS") == "1" {
		t.Log(notice)
		return
	}
	t.Fatal(notice + " (set RMQTX_NO_FAILPOINTS=1 to run without them on purpose)")
}
