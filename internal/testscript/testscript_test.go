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
// a fake go that records its command lines and answers each `go test -json`
// with a stream made for the case.

// fakeGo describes the fake go binary. A stream left empty is a complete,
// passing one for its step (runScript makes it).
type fakeGo struct {
	stream    string // what the patched build's `go test -json` prints
	short     string // ... the upstream build's -short run
	broker    string // ... its real-broker run (testguard -view=upstream)
	crash     string // ... its crash matrix run (-run ^TestCrashMatrix$, -view=upstream-crash)
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

// listed returns the tests that view of scripts/test-names.txt requires
// ("": the whole suite), as testguard -list prints them, by package in
// order.
func listed(t *testing.T, guard, view string) (pkgs []string, tests map[string][]string) {
	t.Helper()
	cmd := exec.Command(guard, "-list", "-view", view, "-names", filepath.Join(root(t), "scripts", "test-names.txt"))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "testguard -list -view %q: %s", view, stderr.String())
	tests = map[string][]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		require.Len(t, f, 2, sc.Text())
		if tests[f[0]] == nil {
			pkgs = append(pkgs, f[0])
		}
		tests[f[0]] = append(tests[f[0]], f[1])
	}
	require.NotEmpty(t, pkgs, "view %q lists tests", view)
	return pkgs, tests
}

// stream writes a go test -json stream in which every test that view of
// the names file lists passes (and a crash test's child process returns at
// once, as it does in the parent), then applies edit to its events
// (package, test, action; an action "output <text>" is a line the test
// printed) before writing.
func stream(t *testing.T, guard, view string, edit func(ev [][3]string) [][3]string) string {
	t.Helper()
	pkgs, tests := listed(t, guard, view)
	var evs [][3]string
	for _, pkg := range pkgs {
		for _, test := range tests[pkg] {
			evs = append(evs, [3]string{pkg, test, "pass"})
		}
		if pkg == "txproducer" {
			evs = append(evs, [3]string{pkg, "TestHelperProcess", "pass"})
		}
		evs = append(evs, [3]string{pkg, "", "pass"})
	}
	if edit != nil {
		evs = edit(evs)
	}
	var b strings.Builder
	for _, e := range evs {
		fields := map[string]string{"Action": e[2], "Package": module + e[0], "Test": e[1]}
		if text, ok := strings.CutPrefix(e[2], "output "); ok { // a line the test printed
			fields["Action"], fields["Output"] = "output", text+"\n"
		}
		line, err := json.Marshal(fields)
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
// a fake go and stubs, and guard as testguard. It returns the exit code, the
// output, and the fake go's command lines.
func runScript(t *testing.T, guard, script, views string, f fakeGo) (int, string, []string) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatalf("bash is required: %v", err)
	}
	for p, view := range map[*string]string{&f.stream: "", &f.short: "", &f.broker: "upstream", &f.crash: "upstream-crash"} {
		if *p == "" {
			*p = stream(t, guard, view, nil)
		}
	}
	dir := t.TempDir()
	calls := filepath.Join(dir, "calls")
	fake := filepath.Join(dir, "go")
	sh := "#!/usr/bin/env bash\necho \"$*\" >>'" + calls + "'\n"
	if f.failFirst {
		sh += "n=$(wc -l <'" + calls + "'); if [ \"$n\" -eq 1 ]; then exit 1; fi\n"
	}
	sh += "args=\" $* \"\n" +
		"if [[ $args == *\" -json \"* ]]; then\n" +
		"  case $args in\n" +
		"    *\" -modfile=\"*\" -short \"*) cat '" + f.short + "';;\n" +
		"    *\" -modfile=\"*TestCrashMatrix*) cat '" + f.crash + "';;\n" +
		"    *\" -modfile=\"*) cat '" + f.broker + "';;\n" +
		"    *) cat '" + f.stream + "';;\n" +
		"  esac\n" +
		"fi\n"
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
		"RMQTX_UPSTREAM_MODFILE="+view, "RMQTX_VIEWS="+views, "RMQTX_TESTGUARD="+guard,
		"RMQTX_TEST_EXPECT="+filepath.Join(root(t), "scripts", "test-expect.txt"),
		"RMQTX_TEST_NAMES="+filepath.Join(root(t), "scripts", "test-names.txt"),
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
// command once: the patched one under -race, then the upstream one, whose
// go test runs are checked by testguard as well.
func TestPassingRunPasses(t *testing.T) {
	g := testguard(t)
	rc, out, calls := runScript(t, g, script(t), "patched upstream", fakeGo{})
	require.Empty(t, judge(rc, calls, false), out)
	require.Equal(t, 4, strings.Count(out, "testguard: PASS"), "the patched run and the upstream build's three go test runs:\n%s", out)
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
	for _, c := range upstream[2:] {
		require.True(t, strings.HasPrefix(c, "test -json "), "every upstream go test is read by testguard: %s", c)
	}
	require.Contains(t, strings.Join(upstream, "\n"), "./txproducer/ ./checkback/ ./consumer/ ./outbox/")
	require.Contains(t, strings.Join(upstream, "\n"), "-run ^TestCrashMatrix$")
}

// A failing go test fails the run after one go test: nothing is retried,
// whatever the failure looks like (a ghost next to a client-only race, a
// broker that did not come back, a race report).
func TestFailureFailsTheRun(t *testing.T) {
	g := testguard(t)
	rc, out, calls := runScript(t, g, script(t), "patched upstream", fakeGo{stream: stream(t, g, "", func(ev [][3]string) [][3]string {
		return append(ev, [3]string{"suites/faultsuite", "TestCrashMatrix", "fail"}, [3]string{"suites/faultsuite", "", "fail"})
	}), code: 1})
	require.Empty(t, judge(rc, calls, true), out)
	require.Contains(t, out, "== FAIL")
}

// drop removes the events of one package (test "") or of one test.
func drop(pkg, test string) func(ev [][3]string) [][3]string {
	return func(ev [][3]string) [][3]string {
		var out [][3]string
		for _, e := range ev {
			if e[0] != pkg || test != "" && e[1] != test {
				out = append(out, e)
			}
		}
		return out
	}
}

// A run that did not run the proof fails although go test passed, and
// testguard names what is missing: a skipped test (-short), a listed test
// or a suite that did not run (-run, a missing package), a test on one
// database only, a test the list does not know, the failpoints tag missing.
func TestShortfallsFailTheRun(t *testing.T) {
	g := testguard(t)
	for name, tc := range map[string]struct {
		edit func(ev [][3]string) [][3]string
		want string
	}{
		"a skipped test": {func(ev [][3]string) [][3]string {
			return append(drop("txproducer", "TestCommits")(ev), [3]string{"txproducer", "TestCommits", "skip"})
		}, "txproducer: TestCommits was skipped"},
		"a suite that did not run": {drop("suites/faultsuite", ""), "suites/faultsuite: TestCrashMatrix did not run"},
		"one test that did not run": {drop("suites/clustersuite", "TestBrokerKilledUnderLoad"),
			"suites/clustersuite: TestBrokerKilledUnderLoad did not run"},
		"a test on one database only": {func(ev [][3]string) [][3]string {
			return append(ev, [3]string{"schema", "TestMigrateComponents/mysql", "pass"})
		}, "schema: TestMigrateComponents must pass on both databases: postgres did not run"},
		"a test that used MariaDB only": {func(ev [][3]string) [][3]string {
			return append(ev, [3]string{"txproducer", "TestCommits", "output     testenv.go:135: testenv: database mysql rmqtx_t_0123456789ab"})
		}, "txproducer: TestCommits used a mysql database only"},
		"a test the list does not know": {func(ev [][3]string) [][3]string {
			return append(ev, [3]string{"txproducer", "TestUnlisted", "pass"})
		}, "txproducer: ran TestUnlisted, which the names file does not list"},
		"the failpoints tag missing": {func(ev [][3]string) [][3]string {
			return append(ev, [3]string{"suites/faultsuite", "TestFailpointsNotCompiled", "pass"})
		}, "suites/faultsuite: ran TestFailpointsNotCompiled, which must never run here"},
	} {
		t.Run(name, func(t *testing.T) {
			rc, out, calls := runScript(t, g, script(t), "patched", fakeGo{stream: stream(t, g, "", tc.edit)})
			require.Empty(t, judge(rc, calls, true), out)
			require.Contains(t, out, "testguard: FAIL: "+tc.want)
		})
	}
}

// The upstream build's go test runs are held to their views of the names
// file: a -run pattern that matches nothing, a test left out or let in, a
// package missing from the -short run each fail the run although go test
// passed.
func TestUpstreamShortfallsFailTheRun(t *testing.T) {
	g := testguard(t)
	empty := stream(t, g, "upstream-crash", drop("suites/faultsuite", "TestCrashMatrix"))
	for name, tc := range map[string]struct {
		script string
		f      fakeGo
		want   string
	}{
		"a -run pattern that matches nothing": {script(t), fakeGo{crash: empty}, "suites/faultsuite: TestCrashMatrix did not run"},
		"a -run pattern with a typo": {plant(t, "-run '^TestCrashMatrix$'", "-run '^TestCrashMatrx$'"), fakeGo{},
			"suites/faultsuite: TestCrashMatrix did not run"},
		"a package left out": {script(t), fakeGo{broker: stream(t, g, "upstream", drop("checkback", ""))},
			"checkback: TestCheckFromMessage did not run"},
		"the test upstream leaves out ran": {script(t), fakeGo{broker: stream(t, g, "upstream", func(ev [][3]string) [][3]string {
			return append(ev, [3]string{"txproducer", "TestShutdownStopsCheckLoop", "pass"})
		})}, "txproducer: ran TestShutdownStopsCheckLoop, which view upstream leaves out"},
		"a package missing from the -short run": {script(t), fakeGo{short: stream(t, g, "", drop("wire", ""))},
			"wire: TestRoundTrip did not run"},
	} {
		t.Run(name, func(t *testing.T) {
			rc, out, calls := runScript(t, g, tc.script, "patched upstream", tc.f)
			require.Empty(t, judge(rc, calls, true), out)
			require.Contains(t, out, "testguard: FAIL: "+tc.want)
			require.Contains(t, out, "== FAIL")
		})
	}
}

// A failure in the upstream build fails the run after the patched build
// passed, and ends it.
func TestUpstreamFailureFailsTheRun(t *testing.T) {
	one := 1
	rc, out, calls := runScript(t, testguard(t), script(t), "patched upstream", fakeGo{upstream: &one})
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
	g := testguard(t)
	good := stream(t, g, "", nil)
	noFault := stream(t, g, "", drop("suites/faultsuite", ""))
	noCrash := stream(t, g, "upstream-crash", drop("suites/faultsuite", "TestCrashMatrix"))
	for name, tc := range map[string]struct {
		old, new string
		views    string
		f        fakeGo
		mustFail bool
	}{
		"a retry in inner": {"  go_tests || rc=$?\n", "  go_tests || go_tests || rc=$?\n", "patched",
			fakeGo{stream: good, failFirst: true}, true},
		"-short": {"-count=1 -timeout 45m", "-count=1 -short -timeout 45m", "patched", fakeGo{stream: good}, false},
		"the failpoints tag missing": {"test -json -race -tags failpoints -count=1", "test -json -race -count=1", "patched",
			fakeGo{stream: good}, false},
		"the guard removed": {`"$TESTGUARD" -echo -expect "$EXPECT" -names "$NAMES" | tee "$LOG"`, `cat | tee "$LOG"`, "patched",
			fakeGo{stream: noFault}, true},
		"the upstream guard removed": {`"$TESTGUARD" -echo -expect "$EXPECT" -names "$NAMES" "$guard"`, "cat", "patched upstream",
			fakeGo{crash: noCrash}, true},
	} {
		t.Run(name, func(t *testing.T) {
			rc, out, calls := runScript(t, g, plant(t, tc.old, tc.new), tc.views, tc.f)
			require.NotEmpty(t, judge(rc, calls, tc.mustFail), "the plant went unnoticed:\n%s", out)
		})
	}
}
