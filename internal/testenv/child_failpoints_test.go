//go:build failpoints

package testenv

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/failpoint"
)

const envChildMode = "RMQTX_TESTENV_CHILD_MODE"

// TestHelperProcessTestenv is not a test: TestChildCrash runs it as a child
// that ends the way its mode says.
func TestHelperProcessTestenv(t *testing.T) {
	if !IsChild(t) {
		return
	}
	switch os.Getenv(envChildMode) {
	case "kill":
		failpoint.Inject(os.Getenv(failpoint.EnvVar))
		t.Fatal("the armed failpoint did not kill the child")
	case "fail":
		t.Fatal("the child failed")
	case "hang":
		<-time.After(time.Minute) // killed by the parent's Timeout first
	}
	// "exit": returns, the child passes and exits 0.
}

// Only a death by the failpoint's SIGKILL is a crash; an exit, a failure or
// a child killed by the parent's own timeout is an error.
func TestChildCrash(t *testing.T) {
	if InChild() {
		t.Fatal("the parent runs with " + EnvChild + " set")
	}
	run := func(mode string, timeout time.Duration) error {
		_, err := Child{Test: "TestHelperProcessTestenv", Failpoint: "testenv.demo", Timeout: timeout,
			Env: []string{envChildMode + "=" + mode}}.Crash(context.Background())
		return err
	}
	if err := run("kill", 0); err != nil {
		t.Errorf("killed by the failpoint: %v", err)
	}
	for mode, want := range map[string]string{"exit": "exited normally", "fail": "not killed by the failpoint"} {
		if err := run(mode, 0); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", mode, err, want)
		}
	}
	if err := run("hang", 3*time.Second); err == nil || !strings.Contains(err.Error(), "still ran after") {
		t.Errorf("hang: %v, want a timeout error", err)
	}
	if _, err := (Child{Test: "TestHelperProcessTestenv"}).Crash(context.Background()); err == nil {
		t.Error("a child without a failpoint is refused")
	}
}
