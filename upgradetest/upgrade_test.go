package upgradetest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/rmqtx/rmqtx"

// A program written against the previous release, rewritten by the rules of
// the migration guide (testdata/rules.txt), builds against this tree. Before
// the rewrite it does not: the rules are what the upgrade takes, and each
// of the rules that the program exercises changes something.
func TestPreviousReleaseProgramUpgrades(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	old, err := os.ReadFile(filepath.Join("testdata", "previous", "main.go"))
	require.NoError(t, err)
	ruleText, err := os.ReadFile(filepath.Join("testdata", "rules.txt"))
	require.NoError(t, err)
	rules, err := parseRules(string(ruleText))
	require.NoError(t, err)

	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	require.NoError(t, err)
	rw := rewriter{gofmt: filepath.Join(strings.TrimSpace(string(goroot)), "bin", "gofmt")}

	// Unchanged, the old program no longer builds.
	out, err := build(t, root, old)
	require.Error(t, err, "the previous release's program builds unchanged; is testdata/previous still old?")
	t.Logf("unchanged, the build fails as expected:\n%s", out)

	src := old
	changed := map[string]int{}
	for _, r := range rules {
		var n int
		src, n, err = rw.run(r, src)
		require.NoError(t, err, "rules.txt:%d", r.line)
		changed[r.kind+" "+strings.Join(r.args, " ")] += n
	}
	src, err = fixImports(src, module)
	require.NoError(t, err)

	// The rules the program was written to exercise: if one stops matching
	// (the program or the rule changed), this says which.
	for _, want := range []string{
		"unwrap consumer.Config ProcessorConfig",
		"observe txproducer.Config Logger Metrics TracerProvider",
		"observe consumer.Config Logger Metrics TracerProvider",
		"observe outbox.Config Logger Metrics TracerProvider",
		"observe outbox.RocketMQConfig Logger",
		"observe replay.Config Logger Metrics TracerProvider",
		"observe archive.Config Logger",
		"migrate txlog.New TxLog",
		"gofmt outbox.Migrate(a, b, c) -> schema.Migrate(a, b, schema.Options{Prefix: c, Components: []schema.Component{schema.Outbox}})",
		"gofmt checkback.RecoveryResult -> discard.Result",
		"gofmt a.RetryClass() -> string(a.ErrorClass())",
	} {
		require.Positive(t, changed[want], "rule %q changed nothing in testdata/previous/main.go", want)
	}

	t.Logf("upgraded main.go:\n%s", src)
	out, err = build(t, root, src)
	require.NoError(t, err, "the upgraded program does not build:\n%s\n--- upgraded main.go:\n%s", out, src)

	// The upgraded program is in the form the guide recommends: one level
	// for the consumer, Observe in every Config.
	require.NotContains(t, string(src), "ProcessorConfig")
	require.Len(t, regexp.MustCompile(`Observe:\s+observe\.Observe\{`).FindAll(src, -1), 6, "%s", src)
}

// build compiles src as package main of a module that requires rmqtx from
// root, with root's own replacements (the patched client), offline from the
// module cache when the environment's GOFLAGS and GOPROXY allow no more.
func build(t *testing.T, root string, src []byte) ([]byte, error) {
	t.Helper()
	dir := t.TempDir()
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	var mod bytes.Buffer
	mod.WriteString("module upgradeprobe\n\n")
	mod.WriteString(regexp.MustCompile(`(?m)^go .*$`).FindString(string(gomod)) + "\n\n")
	mod.WriteString("require " + module + " v0.0.0\n\n")
	mod.WriteString("replace " + module + " => " + root + "\n")
	// A dependency's replace directives do not apply to the modules that
	// require it: carry rmqtx's over, relative paths made absolute.
	for _, m := range regexp.MustCompile(`(?m)^replace (\S+) => (\S+)\s*$`).FindAllStringSubmatch(string(gomod), -1) {
		target := m[2]
		if strings.HasPrefix(target, ".") {
			target = filepath.Join(root, target)
		}
		mod.WriteString("replace " + m[1] + " => " + target + "\n")
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), mod.Bytes(), 0o600))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.go"), src, 0o600))

	cmd := exec.Command("go", "build", "-o", os.DevNull, ".")
	cmd.Dir = dir
	// -mod=mod lets go fill in the probe's require lines; every module it
	// needs is one rmqtx itself needs, so the module cache already has it.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	return cmd.CombinedOutput()
}
