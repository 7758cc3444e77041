package testscript

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// runScript runs `scripts/test.sh --go-only` with a fake go binary that
// prints the captured log and exits with code. It returns the script's exit
// code, its output and how many times the fake go ran.
func runScript(t *testing.T, capturedLog string, code int) (int, string, int) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is required: %v", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	logPath, err := filepath.Abs(filepath.Join("testdata", capturedLog))
	require.NoError(t, err)
	fake := filepath.Join(dir, "go")
	script := "#!/usr/bin/env bash\necho \"$*\" >>'" + calls + "'\ncat '" + logPath + "'\nexit " + strconv.Itoa(code) + "\n"
	require.NoError(t, os.WriteFile(fake, []byte(script), 0o755))

	cmd := exec.Command("bash", filepath.Join(root, "scripts", "test.sh"), "--go-only")
	cmd.Dir = root
	// A private run folder and TMPDIR: the real suite's log and fault
	// summary (which may be running right now) are never touched.
	cmd.Env = append(os.Environ(), "RMQTX_GO="+fake, "RMQTX_RUN_DIR="+dir, "TMPDIR="+dir, "RMQTX_TEST_ARGS=")
	out, err := cmd.CombinedOutput()
	rc := 0
	if err != nil {
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "test.sh did not run: %s", out)
		rc = ee.ExitCode()
	}
	b, err := os.ReadFile(calls)
	require.NoError(t, err, "the fake go never ran: %s", out)
	n := strings.Count(string(b), "\n")
	return rc, string(out), n
}

// The masked case of issue 12: TestCrashMatrix fails on a ghost while the
// log also holds a race report whose frames are all inside the client. The
// old classifier re-ran it, so a lucky second run turned it green. The run
// must fail, after exactly one go test.
func TestMaskedGhostFailsTheRun(t *testing.T) {
	rc, out, calls := runScript(t, "masked-ghost.log", 1)
	require.NotZero(t, rc, "a ghost next to a client-only race must fail the run:\n%s", out)
	require.Equal(t, 1, calls, "go test must run once: nothing is retried")
	require.Contains(t, out, "== FAIL")
}

// A restart that did not come back is a failure of its own, never retried.
func TestBrokerNotBackFailsTheRun(t *testing.T) {
	rc, out, calls := runScript(t, "broker-not-back.log", 1)
	require.NotZero(t, rc, out)
	require.Equal(t, 1, calls)
}

// Even a failure made only of races inside the client fails the run: those
// races are fixed in third_party/rocketmq-client-go, so a new one is news.
func TestClientOnlyRaceFailsTheRun(t *testing.T) {
	rc, out, calls := runScript(t, "client-race-only.log", 1)
	require.NotZero(t, rc, out)
	require.Equal(t, 1, calls)
}

// The control: a passing go test passes the script, so the tests above
// measure the script, not a script that always fails.
func TestPassingRunPasses(t *testing.T) {
	rc, out, calls := runScript(t, "pass.log", 0)
	require.Zero(t, rc, out)
	require.Equal(t, 1, calls)
}
