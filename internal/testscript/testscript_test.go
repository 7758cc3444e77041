package testscript

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A run of scripts/test.sh --suite, the path `make test` takes after its
// installs and its network isolation (inner): stub services and fuzzing, and
// a fake go that records its command lines and answers the patched build's
// `go test -json` with a stream made for the case.

// fakeGo describes the fake go binary.
type fakeGo struct {
	stream    string // what `go test -json` prints (the patched build)
	code      int    // exit code of every command
	failFirst bool   // the first command exits 1 whatever code says
	upstream  *int   // exit code of the upstream build's commands (-modfile), when set
}

// module is the module path the fake stream names packages with.
const module = "github.com/rmqtx/rmqtx/"

// root is the repository root.
func root(t *testing.T) string {
	t.Helper()
	r, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	return r
}

// expectRules reads scripts/test-expect.txt: the min rules in order, and the
// forbidden test names.
func expectRules(t *testing.T) (mins [][2]string, forbid []string) {
	t.Helper()
	f, err := os.Open(filepath.Join(root(t), "scripts", "test-expect.txt"))
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		fs := strings.Fields(line)
		switch {
		case len(fs) == 3 && fs[0] == "min":
			mins = append(mins, [2]string{fs[1], fs[2]})
		case len(fs) == 2 && fs[0] == "forbid":
			forbid = append(forbid, fs[1])
		}
	}
	require.NoError(t, sc.Err())
	require.NotEmpty(t, mins, "test-expect.txt lists the suites a run must run")
	require.NotEmpty(t, forbid)
	return mins, forbid
}

// stream writes a go test -json stream that meets every min rule, then
// applies edit to its events (package, test, action) before writing.
func stream(t *testing.T, edit func(ev [][3]string) [][3]string) string {
	t.Helper()
	mins, _ := expectRules(t)
	var evs [][3]string
	for _, m := range mins {
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		for i := 0; i < n; i++ {
			evs = append(evs, [3]string{m[0], "TestN" + strconv.Itoa(i), "pass"})
		}
		evs = append(evs, [3]string{m[0], "", "pass"})
	}
	if edit != nil {
		evs = edit(evs)
	}
	var b strings.Builder
	for _, e := range evs {
		line, err := json.Marshal(map[string]string{"Action": e[2], "Package": module + e[0], "Test": e[1]})
		require.NoError(t, err)
		b.Write(line)
		b.WriteByte('\n')
	}
	p := filepath.Join(t.TempDir(), "stream.json")
	require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	return p
}

// testguard builds the real testguard once per test.
func testguard(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "testguard")
	cmd := exec.Command("go", "build", "-o", bin, "./internal/tools/testguard")
	cmd.Dir = root(t)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// runScript runs `<script> --suite` with views (e.g. "patched upstream"),
// a fake go and stubs. It returns the exit code, the output, and the fake
// go's command lines.
func runScript(t *testing.T, script, views string, f fakeGo) (int, string, []string) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is required: %v", err)
	}
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	fake := filepath.Join(dir, "go")
	sh := "#!/usr/bin/env bash\necho \"$*\" >>'" + calls + "'\n"
	if f.failFirst {
		sh += "n=$(wc -l <'" + calls + "'); if [ \"$n\" -eq 1 ]; then exit 1; fi\n"
	}
	sh += "case \" $* \" in *\" -json \"*) cat '" + f.stream + "';; esac\n"
	if f.upstream != nil {
		sh += "case \" $* \" in *\" -modfile=\"*) exit " + strconv.Itoa(*f.upstream) + ";; esac\n"
	}
	sh += "exit " + strconv.Itoa(f.code) + "\n"
	require.NoError(t, os.WriteFile(fake, []byte(sh), 0o755))
	view := filepath.Join(dir, "go.upstream.mod")
	require.NoError(t, os.WriteFile(view, []byte("module fake\n"), 0o644))

	cmd := exec.Command("bash", script, "--suite")
	cmd.Dir = root(t)
	// A private run folder and TMPDIR: a real suite running beside this
	// test never shares its logs or fault summaries.
	cmd.Env = append(os.Environ(), "RMQTX_GO="+fake, "RMQTX_RUN_DIR="+dir, "TMPDIR="+dir, "RMQTX_TEST_ARGS=",
		"RMQTX_UPSTREAM_MODFILE="+view, "RMQTX_VIEWS="+views, "RMQTX_TESTGUARD="+testguard(t),
		"RMQTX_TEST_EXPECT="+filepath.Join(root(t), "scripts", "test-expect.txt"),
		"RMQTX_SERVICES=true", "RMQTX_FUZZ=true")
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

// judge is what a correct `make test` does, checked from the outside: the
// patched build runs `go test` exactly once, with -json, -race, the
// failpoints tag, -count=1 and every package, never -short or -run; and the
// run fails exactly when it must.
func judge(rc int, calls []string, mustFail bool) []string {
	var problems, patched []string
	for _, c := range calls {
		if strings.HasPrefix(c, "test ") && !strings.Contains(c, "-modfile=") {
			patched = append(patched, c)
		}
	}
	if len(patched) != 1 {
		problems = append(problems, "patched go test ran "+strconv.Itoa(len(patched))+" times, want once: a failure is never retried")
	}
	for _, c := range patched {
		for _, want := range []string{"-json", "-race", "-tags failpoints", "-count=1", "./..."} {
			if !strings.Contains(" "+c+" ", " "+want+" ") {
				problems = append(problems, "patched go test lacks "+want+": "+c)
			}
		}
		for _, never := range []string{"-short", "-run"} {
			if strings.Contains(" "+c, " "+never) {
				problems = append(problems, "patched go test has "+never+": "+c)
			}
		}
	}
	switch {
	case mustFail && rc == 0:
		problems = append(problems, "the run passed but must fail")
	case !mustFail && rc != 0:
		problems = append(problems, "the run failed but must pass")
	}
	return problems
}

func script(t *testing.T) string { return filepath.Join(root(t), "scripts", "test.sh") }

// The control: a complete, passing run passes, and both builds run, each
// command once: the patched one under -race, then the upstream one.
func TestPassingRunPasses(t *testing.T) {
	rc, out, calls := runScript(t, script(t), "patched upstream", fakeGo{stream: stream(t, nil)})
	require.Empty(t, judge(rc, calls, false), out)
	require.Contains(t, out, "testguard: PASS")
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
	require.Contains(t, strings.Join(upstream, "\n"), "./txproducer/ ./checkback/ ./consumer/ ./outbox/")
	require.Contains(t, strings.Join(upstream, "\n"), "-run ^TestCrashMatrix$")
}

// A failing go test fails the run after one go test: nothing is retried,
// whatever the failure looks like (a ghost next to a client-only race, a
// broker that did not come back, a race report).
func TestFailureFailsTheRun(t *testing.T) {
	rc, out, calls := runScript(t, script(t), "patched upstream", fakeGo{stream: stream(t, func(ev [][3]string) [][3]string {
		return append(ev, [3]string{"faultsuite", "TestCrashMatrix", "fail"}, [3]string{"faultsuite", "", "fail"})
	}), code: 1})
	require.Empty(t, judge(rc, calls, true), out)
	require.Contains(t, out, "== FAIL")
}

// A run that did not run the proof fails although go test passed: a
// skipped test (-short), a suite below its minimum (-run, a missing
// package), the failpoints tag missing.
func TestShortfallsFailTheRun(t *testing.T) {
	for name, edit := range map[string]func(ev [][3]string) [][3]string{
		"a skipped test": func(ev [][3]string) [][3]string {
			return append(ev, [3]string{"txproducer", "TestSkipped", "skip"})
		},
		"a suite that did not run": func(ev [][3]string) [][3]string {
			var out [][3]string
			for _, e := range ev {
				if e[0] != "faultsuite" {
					out = append(out, e)
				}
			}
			return out
		},
		"the failpoints tag missing": func(ev [][3]string) [][3]string {
			return append(ev, [3]string{"faultsuite", "TestFailpointsNotCompiled", "pass"})
		},
	} {
		t.Run(name, func(t *testing.T) {
			rc, out, calls := runScript(t, script(t), "patched", fakeGo{stream: stream(t, edit)})
			require.Empty(t, judge(rc, calls, true), out)
			require.Contains(t, out, "testguard: FAIL")
		})
	}
}

// A failure in the upstream build fails the run after the patched build
// passed, and ends it.
func TestUpstreamFailureFailsTheRun(t *testing.T) {
	one := 1
	rc, out, calls := runScript(t, script(t), "patched upstream", fakeGo{stream: stream(t, nil), upstream: &one})
	require.Empty(t, judge(rc, calls, true), out)
	require.Len(t, calls, 2, "the patched go test, then the upstream build that failed: %q", calls)
	require.Contains(t, calls[1], "build -modfile=")
}

// plant writes a copy of test.sh with old replaced by new into a scratch
// tree laid out like the repository, and returns its path.
func plant(t *testing.T, old, new string) string {
	t.Helper()
	b, err := os.ReadFile(script(t))
	require.NoError(t, err)
	s := string(b)
	require.Contains(t, s, old, "the plant's anchor is in test.sh")
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "scripts"), 0o755))
	up := filepath.Join(dir, "third_party", "rocketmq-client-go")
	require.NoError(t, os.MkdirAll(up, 0o755))
	u, err := os.ReadFile(filepath.Join(root(t), "third_party", "rocketmq-client-go", "UPSTREAM"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(up, "UPSTREAM"), u, 0o644))
	p := filepath.Join(dir, "scripts", "test.sh")
	require.NoError(t, os.WriteFile(p, []byte(strings.Replace(s, old, new, 1)), 0o755))
	return p
}

// Each planted fault in the script is caught: judge reports it, so a change
// that would let a run skip the proof cannot pass this package.
func TestPlantedFaultsAreCaught(t *testing.T) {
	good := stream(t, nil)
	noFault := stream(t, func(ev [][3]string) [][3]string {
		var out [][3]string
		for _, e := range ev {
			if e[0] != "faultsuite" {
				out = append(out, e)
			}
		}
		return out
	})
	for name, tc := range map[string]struct {
		old, new string
		f        fakeGo
		mustFail bool
	}{
		"a retry in inner": {"  go_tests || rc=$?\n", "  go_tests || go_tests || rc=$?\n",
			fakeGo{stream: good, failFirst: true}, true},
		"-short": {"-count=1 -timeout 45m", "-count=1 -short -timeout 45m", fakeGo{stream: good}, false},
		"the failpoints tag missing": {"test -json -race -tags failpoints -count=1", "test -json -race -count=1",
			fakeGo{stream: good}, false},
		"the guard removed": {`"$TESTGUARD" -echo -expect "$EXPECT"`, "cat", fakeGo{stream: noFault}, true},
	} {
		t.Run(name, func(t *testing.T) {
			rc, out, calls := runScript(t, plant(t, tc.old, tc.new), "patched", tc.f)
			require.NotEmpty(t, judge(rc, calls, tc.mustFail), "the plant went unnoticed:\n%s", out)
		})
	}
}
