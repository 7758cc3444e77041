package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/failpoint"
)

// EnvChild is set, in a process started by Child.Crash, to the name of the
// one test function it runs. A normal test process never has it.
const EnvChild = "RMQTX_TEST_CHILD"

// IsChild reports whether this process was started by Child.Crash to run t:
// a TestHelperProcess... function returns at once unless it is.
func IsChild(t testing.TB) bool { return os.Getenv(EnvChild) == t.Name() }

// InChild reports whether this process is any Child.Crash child, so that a
// TestMain skips what only the parent does (starting private services).
func InChild() bool { return os.Getenv(EnvChild) != "" }

// Child is a crash test's subprocess: the running test binary, re-executed
// to run only the test function Test, which does its work until the armed
// failpoint kills it with SIGKILL, the way a kill -9 would. The crash tests
// of several packages share it, so they judge a child's death alike.
type Child struct {
	Test      string        // the TestHelperProcess... function the child runs
	Failpoint string        // armed in the child (failpoint.EnvVar)
	Env       []string      // "KEY=value" settings added to this process's environment
	Timeout   time.Duration // the child is killed, and Crash fails, after this; 0: 2 minutes
}

// Crash runs the child and returns its combined output. The error is nil
// only when the child died by SIGKILL before Timeout: any exit (the helper
// test's own watchdog, a failed require, the failpoint never reached) or a
// timeout is an error that carries the output.
func (c Child) Crash(ctx context.Context) ([]byte, error) {
	if !failpoint.Enabled {
		return nil, errors.New("testenv: a crash child needs a binary built with -tags failpoints")
	}
	if c.Test == "" || c.Failpoint == "" {
		return nil, errors.New("testenv: a crash child needs Test and Failpoint")
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := c.Command(ctx)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err == nil {
		return out.Bytes(), fmt.Errorf("testenv: child %s (%s) exited normally: failpoint never fired\n%s", c.Test, c.Failpoint, out.Bytes())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return out.Bytes(), fmt.Errorf("testenv: child %s (%s): %w\n%s", c.Test, c.Failpoint, err, out.Bytes())
	}
	if ctx.Err() != nil {
		// CommandContext kills with SIGKILL too: that is not the failpoint's.
		return out.Bytes(), fmt.Errorf("testenv: child %s (%s) still ran after %s: %w\n%s", c.Test, c.Failpoint, timeout, ctx.Err(), out.Bytes())
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		return out.Bytes(), fmt.Errorf("testenv: child %s (%s) was not killed by the failpoint: %w\n%s", c.Test, c.Failpoint, err, out.Bytes())
	}
	return out.Bytes(), nil
}

// Command is the child's command, for a test that drives the child itself
// (reads its output as it runs, stops it with a signal) instead of waiting
// for a failpoint's SIGKILL: the test binary, Test alone, EnvChild, Env, and
// the Failpoint when set. ctx kills it.
func (c Child) Command(ctx context.Context) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+c.Test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), EnvChild+"="+c.Test)
	if c.Failpoint != "" {
		cmd.Env = append(cmd.Env, failpoint.EnvVar+"="+c.Failpoint)
	}
	cmd.Env = append(cmd.Env, c.Env...)
	return cmd
}

// MustCrash is Crash that fails t on an error.
func (c Child) MustCrash(t testing.TB) []byte {
	t.Helper()
	out, err := c.Crash(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return out
}
