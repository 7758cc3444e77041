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

// fakeGo describes the fake go binary: it prints the captured log and exits
// with code, or, when upstreamCode is set, exits with that code instead on
// the upstream build's commands (those with -modfile).
type fakeGo struct {
	log          string
	code         int
	upstreamCode *int
}

// runScript runs `scripts/test.sh --go-only` with a fake go binary. It
// returns the script's exit code, its output and the fake go's command
// lines, one per run.
func runScript(t *testing.T, f fakeGo) (int, string, []string) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is required: %v", err)
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	logPath, err := filepath.Abs(filepath.Join("testdata", f.log))
	require.NoError(t, err)
	fake := filepath.Join(dir, "go")
	script := "#!/usr/bin/env bash\necho \"$*\" >>'" + calls + "'\ncat '" + logPath + "'\n"
	if f.upstreamCode != nil {
		script += "case \" $* \" in *\" -modfile=\"*) exit " + strconv.Itoa(*f.upstreamCode) + ";; esac\n"
	}
	script += "exit " + strconv.Itoa(f.code) + "\n"
	require.NoError(t, os.WriteFile(fake, []byte(script), 0o755))
	// A view that exists: the script uses a named view as it is, so the
	// fake go is the only go that runs.
	view := filepath.Join(dir, "go.upstream.mod")
	require.NoError(t, os.WriteFile(view, []byte("module fake\n"), 0o644))

	cmd := exec.Command("bash", filepath.Join(root, "scripts", "test.sh"), "--go-only")
	cmd.Dir = root
	// A private run folder and TMPDIR: the real suite's log and fault
	// summary (which may be running right now) are never touched.
	cmd.Env = append(os.Environ(), "RMQTX_GO="+fake, "RMQTX_RUN_DIR="+dir, "TMPDIR="+dir, "RMQTX_TEST_ARGS=",
		"RMQTX_UPSTREAM_MODFILE="+view, "RMQTX_VIEWS=")
	out, err := cmd.CombinedOutput()
	rc := 0
	if err != nil {
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "test.sh did not run: %s", out)
		rc = ee.ExitCode()
	}
	b, err := os.ReadFile(calls)
	require.NoError(t, err, "the fake go never ran: %s", out)
	return rc, string(out), strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// goTests returns the go test command lines among calls.
func goTests(calls []string) []string {
	var out []string
	for _, c := range calls {
		if strings.HasPrefix(c, "test ") {
			out = append(out, c)
		}
	}
	return out
}

// The masked case of issue 12: TestCrashMatrix fails on a ghost while the
// log also holds a race report whose frames are all inside the client. The
// old classifier re-ran it, so a lucky second run turned it green. The run
// must fail, after exactly one go test.
func TestMaskedGhostFailsTheRun(t *testing.T) {
	rc, out, calls := runScript(t, fakeGo{log: "masked-ghost.log", code: 1})
	require.NotZero(t, rc, "a ghost next to a client-only race must fail the run:\n%s", out)
	require.Len(t, calls, 1, "go test must run once, and a failure ends the run: nothing is retried")
	require.Contains(t, out, "== FAIL")
}

// A restart that did not come back is a failure of its own, never retried.
func TestBrokerNotBackFailsTheRun(t *testing.T) {
	rc, out, calls := runScript(t, fakeGo{log: "broker-not-back.log", code: 1})
	require.NotZero(t, rc, out)
	require.Len(t, calls, 1)
}

// Even a failure made only of races inside the client fails the run: those
// races are fixed in third_party/rocketmq-client-go, so a new one is news.
func TestClientOnlyRaceFailsTheRun(t *testing.T) {
	rc, out, calls := runScript(t, fakeGo{log: "client-race-only.log", code: 1})
	require.NotZero(t, rc, out)
	require.Len(t, calls, 1)
}

// The control: a passing go test passes the script, so the tests above
// measure the script, not a script that always fails. Both builds run, each
// command once: the patched one under -race, then the upstream one.
func TestPassingRunPasses(t *testing.T) {
	rc, out, calls := runScript(t, fakeGo{log: "pass.log", code: 0})
	require.Zero(t, rc, out)
	tests := goTests(calls)
	require.Len(t, tests, 4, "one patched go test and three upstream ones: %q", calls)
	require.Contains(t, tests[0], "-race")
	require.NotContains(t, tests[0], "-modfile=")
	var upstream []string
	for _, c := range calls {
		if strings.Contains(c, "-modfile=") {
			upstream = append(upstream, c)
		}
	}
	require.Len(t, upstream, len(calls)-1, "every command after the patched go test uses the upstream view: %q", calls)
	for _, c := range upstream {
		require.NotContains(t, c, "-race", "the upstream client's own races would fail any -race run")
	}
	require.True(t, strings.HasPrefix(upstream[0], "build "), upstream[0])
	require.True(t, strings.HasPrefix(upstream[1], "vet "), upstream[1])
	seen := map[string]bool{}
	for _, c := range calls {
		require.False(t, seen[c], "ran twice: %s", c)
		seen[c] = true
	}
	require.Contains(t, strings.Join(upstream, "\n"), "./txproducer/ ./checkback/ ./consumer/ ./outbox/")
	require.Contains(t, strings.Join(upstream, "\n"), "-run ^TestCrashMatrix$")
}

// A failure in the upstream build fails the run, after the patched build
// passed, and ends it: the steps after the failing one do not run.
func TestUpstreamFailureFailsTheRun(t *testing.T) {
	one := 1
	rc, out, calls := runScript(t, fakeGo{log: "pass.log", code: 0, upstreamCode: &one})
	require.NotZero(t, rc, out)
	require.Contains(t, out, "== FAIL")
	require.Len(t, calls, 2, "the patched go test, then the upstream build that failed: %q", calls)
	require.Contains(t, calls[1], "build -modfile=")
}
