package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const expectText = `# sample
forbid TestFailpointsNotCompiled
allow-skip internal/testenv
min txproducer 2
`

const namesText = `# sample
exclude * TestHelperProcess* a crash test's child process
one-db schema TestMySQLOnly MariaDB's own syntax
select upstream txproducer *
unselect upstream txproducer TestB proves a patch upstream lacks
select upstream-crash faultsuite TestCrash
` + marker + `
txproducer TestA
txproducer TestB
faultsuite TestCrash
schema TestEachDB
schema TestMySQLOnly
internal/testenv TestOptional
`

func stream(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

func ev(action, pkg, test string) string {
	s := `{"Action":"` + action + `","Package":"github.com/rmqtx/rmqtx/` + pkg + `"`
	if test != "" {
		s += `,"Test":"` + test + `"`
	}
	return s + "}"
}

func judge(t *testing.T, m mode, lines []string) report {
	t.Helper()
	ta, err := read(strings.NewReader(stream(lines...)), "github.com/rmqtx/rmqtx", nil)
	require.NoError(t, err)
	return check(parseExpect(strings.NewReader(expectText)), parseNames(strings.NewReader(namesText)), m, ta)
}

// good is a complete run of namesText's list: the helper process returns
// at once in the parent, TestEachDB passes on both databases.
var good = []string{
	ev("run", "txproducer", "TestA"), ev("pass", "txproducer", "TestA"),
	ev("pass", "txproducer", "TestB/sub"), ev("pass", "txproducer", "TestB"),
	ev("pass", "txproducer", "TestHelperProcess"),
	ev("pass", "txproducer", ""),
	ev("pass", "faultsuite", "TestCrash"), ev("pass", "faultsuite", ""),
	ev("pass", "schema", "TestEachDB/mysql"), ev("pass", "schema", "TestEachDB/postgres"), ev("pass", "schema", "TestEachDB"),
	ev("pass", "schema", "TestMySQLOnly/mysql"), ev("pass", "schema", "TestMySQLOnly"), ev("pass", "schema", ""),
	ev("pass", "internal/testenv", "TestOptional/a"), ev("skip", "internal/testenv", "TestOptional/b"),
	ev("pass", "internal/testenv", "TestOptional"), ev("pass", "internal/testenv", ""),
}

func with(extra ...string) []string { return append(append([]string{}, good...), extra...) }

func without(drop ...string) []string {
	var out []string
	for _, l := range good {
		keep := true
		for _, d := range drop {
			keep = keep && l != d
		}
		if keep {
			out = append(out, l)
		}
	}
	return out
}

func TestACompleteRunPasses(t *testing.T) {
	rep := judge(t, mode{}, good)
	require.Empty(t, rep.problems)
	require.Equal(t, 6, rep.want)
	require.Equal(t, 6, rep.passed)
	require.Equal(t, 1, rep.bothDBs)
}

// Each way a run can miss its proof fails it, naming the test.
func TestPlantedShortfallsFail(t *testing.T) {
	for name, tc := range map[string]struct {
		lines []string
		want  string
	}{
		"a listed test missing (-run)": {without(ev("pass", "faultsuite", "TestCrash")),
			"faultsuite: TestCrash did not run; it is listed"},
		"a package missing": {without(ev("pass", "txproducer", "TestA"), ev("run", "txproducer", "TestA")),
			"txproducer: TestA did not run"},
		"the postgres half missing": {without(ev("pass", "schema", "TestEachDB/postgres")),
			"schema: TestEachDB must pass on both databases: postgres did not run"},
		"the mysql half skipped": {append(without(ev("pass", "schema", "TestEachDB/mysql")), ev("skip", "schema", "TestEachDB/mysql")),
			"schema: TestEachDB must pass on both databases: mysql was skipped"},
		"a nested half missing": {with(ev("pass", "schema", "TestEachDB/case/mysql"), ev("pass", "schema", "TestEachDB/case")),
			"schema: TestEachDB/case must pass on both databases: postgres did not run"},
		"an unlisted test": {with(ev("pass", "txproducer", "TestNew")),
			"txproducer: ran TestNew, which the names file does not list (regenerate it: " + regenerate + ")"},
		"an unlisted package": {with(ev("pass", "newpkg", "TestNew"), ev("pass", "newpkg", "")),
			"newpkg: ran TestNew, which the names file does not list"},
		"a listed test skipped (-short)": {append(without(ev("pass", "txproducer", "TestA")), ev("skip", "txproducer", "TestA")),
			"txproducer: TestA was skipped; it is listed and must run and pass"},
		"a subtest skipped": {with(ev("skip", "txproducer", "TestA/sub")), "txproducer: skipped TestA/sub"},
		"every subtest skipped": {with(ev("skip", "internal/testenv", "TestOptional/a")),
			"internal/testenv: TestOptional passed, but every one of its 2 subtests was skipped"},
		"the failpoints tag missing": {with(ev("pass", "faultsuite", "TestFailpointsNotCompiled")),
			"faultsuite: ran TestFailpointsNotCompiled, which must never run here"},
		"a failed test":    {with(ev("fail", "txproducer", "TestD")), "failed: txproducer TestD"},
		"a failed package": {with(ev("fail", "wire", "")), "failed: wire"},
	} {
		t.Run(name, func(t *testing.T) {
			problems := judge(t, mode{}, tc.lines).problems
			require.Contains(t, strings.Join(problems, "\n"), tc.want)
		})
	}
}

// The crash tests' child processes return at once in the parent: they are
// neither required nor counted, nor reported as unlisted.
func TestChildProcessesAreIgnored(t *testing.T) {
	rep := judge(t, mode{}, without(ev("pass", "txproducer", "TestHelperProcess")))
	require.Empty(t, rep.problems)
	rep = judge(t, mode{}, with(ev("pass", "faultsuite", "TestHelperProcessFault")))
	require.Empty(t, rep.problems)
	require.Equal(t, 6, rep.passed)
}

// A view requires what its select rules take and nothing else.
func TestViews(t *testing.T) {
	up := []string{
		ev("pass", "txproducer", "TestA"), ev("pass", "txproducer", "TestHelperProcess"), ev("pass", "txproducer", ""),
	}
	rep := judge(t, mode{view: "upstream"}, up)
	require.Empty(t, rep.problems)
	require.Equal(t, 1, rep.want)

	for name, tc := range map[string]struct {
		view  string
		lines []string
		want  string
	}{
		"a -run pattern that matches nothing": {"upstream-crash", []string{ev("pass", "faultsuite", "")},
			"faultsuite: TestCrash did not run"},
		"the test the view leaves out": {"upstream", append(up, ev("pass", "txproducer", "TestB")),
			"txproducer: ran TestB, which view upstream leaves out (proves a patch upstream lacks)"},
		"a listed test of another package": {"upstream", append(up, ev("pass", "faultsuite", "TestCrash")),
			"faultsuite: ran TestCrash, which view upstream does not list"},
		"a view without rules": {"nosuch", up, `no select rule for view "nosuch"`},
	} {
		t.Run(name, func(t *testing.T) {
			problems := judge(t, mode{view: tc.view}, tc.lines).problems
			require.Contains(t, strings.Join(problems, "\n"), tc.want)
		})
	}
}

// A -short run may skip listed tests and database halves, but must report
// every listed test.
func TestShortRun(t *testing.T) {
	short := []string{
		ev("pass", "txproducer", "TestA"), ev("skip", "txproducer", "TestB"), ev("pass", "txproducer", ""),
		ev("skip", "faultsuite", "TestCrash"), ev("pass", "faultsuite", ""),
		ev("skip", "schema", "TestEachDB/mysql"), ev("skip", "schema", "TestEachDB/postgres"), ev("pass", "schema", "TestEachDB"),
		ev("skip", "schema", "TestMySQLOnly"), ev("pass", "schema", ""),
		ev("skip", "internal/testenv", "TestOptional"), ev("pass", "internal/testenv", ""),
	}
	rep := judge(t, mode{short: true}, short)
	require.Empty(t, rep.problems)
	require.Equal(t, 2, rep.passed)
	require.Equal(t, 4, rep.skipped)
	problems := judge(t, mode{short: true}, short[3:]).problems
	require.Contains(t, strings.Join(problems, "\n"), "txproducer: TestA did not run")
}

// A one-db rule excuses the missing half of the test it names only.
func TestOneDBRule(t *testing.T) {
	require.Empty(t, judge(t, mode{}, good).problems, "TestMySQLOnly ran its mysql half only")
	problems := judge(t, mode{}, with(ev("fail", "schema", "TestMySQLOnly/postgres"))).problems
	require.Equal(t, []string{"failed: schema TestMySQLOnly/postgres"}, problems, "a failure is never excused")
}

// out is an output event: a line a test printed.
func out(pkg, test, text string) string {
	return `{"Action":"output","Package":"github.com/rmqtx/rmqtx/` + pkg + `","Test":"` + test + `","Output":"` + text + `\n"}`
}

// mark is the line testenv.MySQLDB or PostgresDB logs for a database of
// kind, as t.Log prints it in a go test -json stream.
func mark(pkg, test, kind string) string {
	return out(pkg, test, "    testenv.go:135: "+dbMarker+kind+" rmqtx_t_0123456789ab")
}

// A test whose output shows databases of one kind only fails, naming the
// rule that would excuse it; an EachDB test, a test that opens both
// itself, and a test a one-db rule names pass; a rule whose test used both
// fails.
func TestDatabaseMarkers(t *testing.T) {
	eachDB := with(mark("schema", "TestEachDB/mysql", "mysql"), mark("schema", "TestEachDB/postgres", "postgres"))
	rep := judge(t, mode{}, eachDB)
	require.Empty(t, rep.problems)
	require.Equal(t, 1, rep.bothDBs)
	require.Zero(t, rep.oneDB)

	ruled := with(mark("schema", "TestMySQLOnly/mysql", "mysql"))
	rep = judge(t, mode{}, ruled)
	require.Empty(t, rep.problems, "a one-db rule names TestMySQLOnly")
	require.Equal(t, 1, rep.oneDB)

	both := with(mark("txproducer", "TestA", "postgres"), mark("txproducer", "TestA", "mysql"))
	require.Empty(t, judge(t, mode{}, both).problems, "a test that opens both databases itself (no subtests)")

	child := with(mark("txproducer", "TestHelperProcess", "mysql"))
	require.Empty(t, judge(t, mode{}, child).problems, "a crash test's child process is not a test of its own")

	require.Empty(t, judge(t, mode{}, with(out("txproducer", "TestA", "testenv: database oracle x"), out("txproducer", "", dbMarker+"mysql x"))).problems,
		"an unknown kind, or a line outside any test, marks nothing")

	fix := `run it on both (testenv.EachDB) or give it a rule "one-db txproducer TestA <why>" in the names file`
	for name, tc := range map[string]struct {
		view  string
		lines []string
		want  string
	}{
		"a new test on MariaDB only (testenv.DB)": {"", with(mark("txproducer", "TestA", "mysql")),
			`txproducer: TestA used a mysql database only (its output has "testenv: database mysql" and no other kind): ` + fix},
		"a new test on PostgreSQL only": {"", with(mark("txproducer", "TestA", "postgres")),
			`txproducer: TestA used a postgres database only`},
		"a one-database test in a subtest of its own": {"", with(mark("txproducer", "TestB/sub", "mysql")),
			`txproducer: TestB used a mysql database only`},
		"a one-database test in a view": {"upstream", []string{
			ev("pass", "txproducer", "TestA"), mark("txproducer", "TestA", "mysql"), ev("pass", "txproducer", ""),
		}, `txproducer: TestA used a mysql database only`},
		"a one-db rule that excuses nothing": {"", with(mark("schema", "TestMySQLOnly/mysql", "mysql"), mark("schema", "TestMySQLOnly/postgres", "postgres"), ev("pass", "schema", "TestMySQLOnly/postgres")),
			`schema: TestMySQLOnly used both databases, but a one-db rule excuses it (MariaDB's own syntax): remove the rule`},
	} {
		t.Run(name, func(t *testing.T) {
			problems := judge(t, mode{view: tc.view}, tc.lines).problems
			require.Contains(t, strings.Join(problems, "\n"), tc.want)
			require.Len(t, problems, 1, "%q", problems)
		})
	}
}

// testguard's copy of the marker is the text testenv logs.
func TestDBMarkerMatchesTestenv(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "testenv", "postgres.go"))
	require.NoError(t, err)
	require.Contains(t, string(src), "const DBMarker = \""+dbMarker+"\"\n")
	require.Equal(t, "postgres", dbKind("    postgres.go:137: testenv: database postgres rmqtx_t_0123456789ab\n"))
	require.Equal(t, "mysql", dbKind("testenv: database mysql rmqtx_t_0123456789ab"))
	require.Empty(t, dbKind("testenv: create database: boom"))
	require.Empty(t, dbKind("testenv: kept database rmqtx_t_0123456789ab"))
}

func TestBadRulesAreReported(t *testing.T) {
	nm := parseNames(strings.NewReader(`nonsense rule here
exclude * TestX
one-db a TestGone its reason
unselect v a TestGone its reason
exclude a TestH* child
a TestHelper
a Testify
`))
	require.Len(t, nm.lineErrors, 6, "%q", nm.lineErrors)
	all := strings.Join(nm.lineErrors, "\n")
	for _, want := range []string{"line 1: unknown rule", "line 2: unknown rule", "one-db names a TestGone, which is not listed",
		"unselect v names a TestGone, which is not listed", "a TestHelper is listed and excluded", "line 7: not a test name"} {
		require.Contains(t, all, want)
	}
	ex := parseExpect(strings.NewReader("min x 3\nmin x zero\nbogus\n"))
	require.Equal(t, []string{`expect line 3: unknown rule "bogus"`}, ex.lineErrors, "min lines are obsolete and ignored")
}

// -echo prints what a plain go test prints: package lines and the output of
// failing tests only; a line that is not JSON passes through.
func TestEchoShowsWhatGoTestShows(t *testing.T) {
	var b strings.Builder
	js := stream(
		`{"Action":"output","Package":"github.com/rmqtx/rmqtx/x","Test":"TestOK","Output":"quiet\n"}`,
		`{"Action":"pass","Package":"github.com/rmqtx/rmqtx/x","Test":"TestOK"}`,
		`{"Action":"output","Package":"github.com/rmqtx/rmqtx/x","Test":"TestBad","Output":"boom\n"}`,
		`{"Action":"fail","Package":"github.com/rmqtx/rmqtx/x","Test":"TestBad"}`,
		`# a toolchain line`,
		`{"Action":"output","Package":"github.com/rmqtx/rmqtx/x","Output":"FAIL\tgithub.com/rmqtx/rmqtx/x\n"}`,
		`{"Action":"fail","Package":"github.com/rmqtx/rmqtx/x"}`,
	)
	ta, err := read(strings.NewReader(js), "github.com/rmqtx/rmqtx", &b)
	require.NoError(t, err)
	require.Equal(t, "boom\n# a toolchain line\nFAIL\tgithub.com/rmqtx/rmqtx/x\n", b.String())
	require.Contains(t, ta.failed, "x TestBad")
}

// testsInFile finds what go test runs, and only that.
func TestTestsInFile(t *testing.T) {
	src := `package p

import "testing"

func TestMain(m *testing.M) {}
func TestA(t *testing.T)    {}
func Test(t *testing.T)     {}
func Testify(t *testing.T)  {}
func Test_b(t *testing.T)   {}
func FuzzC(f *testing.F)    {}
func BenchmarkD(b *testing.B) {}
type s struct{}
func (s) TestMethod(t *testing.T) {}

func ExampleWithOutput() {
	// Output: x
}

func ExampleNoOutput() {}
`
	p := filepath.Join(t.TempDir(), "p_test.go")
	require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
	got, err := testsInFile(p)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"TestA", "Test", "Test_b", "FuzzC", "ExampleWithOutput"}, got)
}

// -write-names keeps the hand-kept rules, applies the exclusions, and is
// stable.
func TestRenderKeepsRules(t *testing.T) {
	tests := map[string][]string{"b": {"TestB", "TestHelperProcess"}, "a": {"ExampleA", "TestA"}}
	hand := "# header\nexclude * TestHelperProcess* child\n"
	out, listed, excluded := render([]byte(hand), tests)
	require.Equal(t, hand+"\n"+marker+"\na ExampleA\na TestA\nb TestB\n", string(out))
	require.Equal(t, 3, listed)
	require.Equal(t, 1, excluded)
	again, _, _ := render(out, tests)
	require.Equal(t, string(out), string(again))
	nm := parseNames(strings.NewReader(string(out)))
	require.Empty(t, nm.lineErrors)
	require.Len(t, nm.listed, 3)
}

// The committed list is the one -write-names makes of this tree: a test
// added, renamed or removed without regenerating fails here (and the suite
// run fails by name).
func TestNamesListIsCurrent(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	require.NoError(t, err)
	file := filepath.Join(root, "scripts", "test-names.txt")
	old, err := os.ReadFile(file)
	require.NoError(t, err)
	tests, err := listTests(root, "github.com/rmqtx/rmqtx", "failpoints")
	require.NoError(t, err)
	got, _, _ := render(old, tests)
	if stale := lineDiff(string(old), string(got)); len(stale) > 0 {
		t.Fatalf("scripts/test-names.txt is stale (- listed, + in the sources); run: %s\n%s", regenerate, strings.Join(stale, "\n"))
	}
	require.True(t, string(old) == string(got), "scripts/test-names.txt is out of order; run: %s", regenerate)
	nm := parseNames(strings.NewReader(string(old)))
	require.Empty(t, nm.lineErrors)
	for _, view := range []string{"", "upstream", "upstream-crash"} {
		want, _, err := nm.expected(view)
		require.NoError(t, err, view)
		require.NotEmpty(t, want, view)
	}
	ex, err := os.ReadFile(filepath.Join(root, "scripts", "test-expect.txt"))
	require.NoError(t, err)
	require.Empty(t, parseExpect(strings.NewReader(string(ex))).lineErrors)
}

// lineDiff returns the lines only in a ("-") or only in b ("+").
func lineDiff(a, b string) []string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	ma, mb := in(a), in(b)
	var d []string
	for _, l := range strings.Split(a, "\n") {
		if !mb[l] {
			d = append(d, "- "+l)
		}
	}
	for _, l := range strings.Split(b, "\n") {
		if !ma[l] {
			d = append(d, "+ "+l)
		}
	}
	return d
}
