//go:build !failpoints

package faultsuite

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/rmqtx/rmqtx/internal/failpoint"
)

// notice is what a plain `go test ./...` (without -tags failpoints) says it
// did not run: the whole fault suite here, and the crash tests of
// txproducer, outbox and consumer, which compile only with the tag.
const notice = "rmqtx: crash and fault-injection tests NOT compiled (they need -tags failpoints); " +
	"run them with `make test` or `go test -race -tags failpoints ./...`\n"

// TestMain prints the notice where a person will see it. go test hides a
// passing package's output in package-list mode, so on Linux the line also
// goes to the go command's own stderr when go is this binary's parent; with
// -v it is in the package's output too.
func TestMain(m *testing.M) {
	fmt.Print(notice)
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", os.Getppid())); err == nil && strings.TrimSpace(string(comm)) == "go" {
		if f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/2", os.Getppid()), os.O_WRONLY|os.O_APPEND, 0); err == nil {
			_, _ = f.WriteString(notice)
			_ = f.Close()
		}
	}
	os.Exit(m.Run())
}

// TestFailpointsNotCompiled keeps the package from reporting "no tests":
// it asserts that the failpoint build tag really is off in this build, so
// the notice above is true.
func TestFailpointsNotCompiled(t *testing.T) {
	if failpoint.Enabled {
		t.Fatal("notag_test.go is built together with the failpoints tag")
	}
}
