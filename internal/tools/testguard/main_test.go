package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const rulesText = `# sample
min txproducer 2
min faultsuite 1
forbid TestFailpointsNotCompiled
allow-skip internal/testenv
`

func stream(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

func ev(action, pkg, test string) string {
	s := `{"Action":"` + action + `","Package":"github.com/rmqtx/rmqtx/` + pkg + `"`
	if test != "" {
		s += `,"Test":"` + test + `"`
	}
	return s + "}"
}

func run(t *testing.T, js string) []string {
	t.Helper()
	ta, err := read(strings.NewReader(js), "github.com/rmqtx/rmqtx", nil)
	require.NoError(t, err)
	return check(parseRules(strings.NewReader(rulesText)), ta)
}

var good = []string{
	ev("run", "txproducer", "TestA"), ev("pass", "txproducer", "TestA"),
	ev("pass", "txproducer", "TestB"), ev("pass", "txproducer", "TestB/sub"),
	ev("pass", "txproducer", ""),
	ev("pass", "faultsuite", "TestCrash"), ev("pass", "faultsuite", ""),
	ev("skip", "internal/testenv", "TestOptional"), ev("pass", "internal/testenv", ""),
}

func TestAGoodRunPasses(t *testing.T) {
	require.Empty(t, run(t, stream(good...)))
}

// Each way a run can miss its proof fails it.
func TestPlantedShortfallsFail(t *testing.T) {
	for name, tc := range map[string]struct {
		lines []string
		want  string
	}{
		"a skipped test (-short)": {append(append([]string{}, good...), ev("skip", "txproducer", "TestC")), "skipped TestC"},
		"too few tests (-run)": {[]string{ev("pass", "txproducer", "TestA"), ev("pass", "txproducer", ""),
			ev("pass", "faultsuite", "TestCrash"), ev("pass", "faultsuite", "")}, "1 tests passed, want at least 2"},
		"a suite that never ran": {good[:5], "faultsuite: did not run"},
		"the failpoints tag missing": {append(append([]string{}, good...), ev("pass", "faultsuite", "TestFailpointsNotCompiled")),
			"ran TestFailpointsNotCompiled"},
		"a failed test": {append(append([]string{}, good...), ev("fail", "txproducer", "TestD")), "failed: txproducer TestD"},
	} {
		t.Run(name, func(t *testing.T) {
			problems := run(t, stream(tc.lines...))
			require.NotEmpty(t, problems)
			require.Contains(t, strings.Join(problems, "\n"), tc.want)
		})
	}
}

func TestBadRulesAreReported(t *testing.T) {
	ru := parseRules(strings.NewReader("min x zero\nnonsense\n"))
	require.Len(t, ru.lineErrors, 2)
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
