package testbed

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The verdict is PASS only when every scenario reached the end of Verify
// with committed events, the invariants held, and the tests passed.
func TestSummaryVerdict(t *testing.T) {
	good := func(name string) *Scenario {
		return &Scenario{Name: name, Attempted: 10, Committed: 8, RolledBack: 2, Consumed: 8, Verified: true}
	}
	for _, tc := range []struct {
		name string
		mod  func(*Summary, *Scenario)
		want []string // in the output
	}{
		{"pass", func(*Summary, *Scenario) {}, []string{": PASS ===="}},
		{"died before verify", func(_ *Summary, s *Scenario) { s.Verified = false },
			[]string{"NOT VERIFIED: b ended before its verification finished", "unverified=1: FAIL"}},
		{"nothing committed", func(_ *Summary, s *Scenario) { s.Committed = 0 }, []string{"NOTHING COMMITTED: b", ": FAIL"}},
		{"lost", func(_ *Summary, s *Scenario) { s.Lost = 1 }, []string{"lost=1 ", ": FAIL"}},
		{"ghost", func(_ *Summary, s *Scenario) { s.Ghosts = 1 }, []string{"ghosts=1 ", ": FAIL"}},
		{"double", func(_ *Summary, s *Scenario) { s.Double = 1 }, []string{"double_effects=1 ", ": FAIL"}},
		{"restart", func(r *Summary, _ *Scenario) { r.restartFailed("broker", 0) }, []string{"RESTART FAILED", ": FAIL"}},
		{"tests failed", func(r *Summary, _ *Scenario) { r.exitCode = 1 }, []string{"TESTS FAILED", ": FAIL"}},
		{"stored twice is a figure", func(_ *Summary, s *Scenario) { s.StoredTwice = 3 }, []string{"stored_more_than_once=3 ", ": PASS"}},
	} {
		r := &Summary{Title: func() string { return "demo" }}
		s := good("b")
		r.Add(good("a"))
		r.Add(s)
		tc.mod(r, s)
		out := r.String()
		for _, w := range tc.want {
			require.Contains(t, out, w, tc.name)
		}
	}
	require.Empty(t, (&Summary{}).String(), "no scenario, no summary")
}

// One scenario run on two databases shows as a row per database, a total
// per database, and the invariants per database on the verdict lines; a
// failure on one database fails the run and names that database.
func TestSummaryPerDatabase(t *testing.T) {
	r := &Summary{Title: func() string { return "demo" }}
	for _, db := range []string{"postgres", "mysql"} {
		r.Add(&Scenario{Name: "crash-matrix", DB: db, Attempted: 10, Committed: 8, RolledBack: 2, Consumed: 8, Verified: true})
	}
	ghost := &Scenario{Name: "duplicate-storm", DB: "postgres", Attempted: 5, Committed: 5, Consumed: 5, Ghosts: 2, Verified: true}
	r.Add(ghost)
	r.Add(&Scenario{Name: "duplicate-storm", DB: "mysql", Attempted: 5, Committed: 5, Consumed: 5})
	out := r.String()
	lines := strings.Split(out, "\n")
	var rows []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 2 && (f[0] == "crash-matrix" || f[0] == "duplicate-storm" || f[0] == "TOTAL") {
			rows = append(rows, f[0]+" "+f[1]+" "+f[2])
		}
	}
	require.Equal(t, []string{
		"crash-matrix mysql 10", "crash-matrix postgres 10", "duplicate-storm mysql 5", "duplicate-storm postgres 5",
		"TOTAL mysql 15", "TOTAL postgres 15", "TOTAL all 30",
	}, rows, out)
	require.Contains(t, out, "==== mysql: lost=0 ghosts=0 double_effects=0 stored_more_than_once=0 ====", out)
	require.Contains(t, out, "==== postgres: lost=0 ghosts=2 double_effects=0 stored_more_than_once=0 ====", out)
	require.Contains(t, out, "NOT VERIFIED: duplicate-storm (mysql) ended before its verification finished", out)
	require.Contains(t, out, "ghosts=2 double_effects=0 stored_more_than_once=0 restarts_failed=0 unverified=1: FAIL", out)

	ghost.Ghosts = 0
	r2 := &Summary{}
	r2.Add(ghost)
	require.Contains(t, r2.String(), "==== postgres: lost=0 ghosts=0", "one database: its own line too")
	require.Contains(t, r2.String(), ": PASS ====")
}

// guarded are the test-support packages that library code must not import.
var guarded = []string{
	"github.com/rmqtx/rmqtx/suites/internal/testbed",
	"github.com/rmqtx/rmqtx/internal/testenv",
	"github.com/rmqtx/rmqtx/internal/configtest",
}

// supportImports lists "file: import" for every non-test Go file under root
// (outside the test-support packages themselves, testdata, third_party and
// hidden folders) that imports one of guarded.
func supportImports(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "third_party" || name == "vendor") {
				return filepath.SkipDir
			}
			for _, g := range guarded {
				if "github.com/rmqtx/rmqtx/"+rel == g {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, g := range guarded {
				if p == g {
					out = append(out, rel+": "+p)
				}
			}
		}
		return nil
	})
	require.NoError(t, err)
	return out
}

// Test support stays out of library code: no non-test file of the module
// imports the test bed, testenv or configtest.
func TestLibraryCodeDoesNotImportTestSupport(t *testing.T) {
	root, err := moduleRoot()
	require.NoError(t, err)
	require.Empty(t, supportImports(t, root))
}

// The guard finds a planted import, and ignores test files and the
// support packages themselves.
func TestImportGuardFindsAPlantedImport(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		p := filepath.Join(root, rel)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
	}
	write("outbox/leak.go", "package outbox\n\nimport _ \"github.com/rmqtx/rmqtx/suites/internal/testbed\"\n")
	write("outbox/ok_test.go", "package outbox\n\nimport _ \"github.com/rmqtx/rmqtx/internal/testenv\"\n")
	write("suites/internal/testbed/bed.go", "package testbed\n\nimport _ \"github.com/rmqtx/rmqtx/internal/testenv\"\n")
	write("consumer/clean.go", "package consumer\n\nimport _ \"fmt\"\n")
	require.Equal(t, []string{"outbox/leak.go: github.com/rmqtx/rmqtx/suites/internal/testbed"}, supportImports(t, root))
}

// A rendezvous runs each step once, in the last party to arrive, and
// releases every party after it; a party that leaves is not waited for; a
// step that ends its goroutine (a t.Fatal) releases the others with false.
func TestRendezvous(t *testing.T) {
	r := NewRendezvous(2)
	var runs atomic.Int32
	var wg sync.WaitGroup
	oks := make([]bool, 4)
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			oks[2*i] = r.Step(func() { runs.Add(1) })
			oks[2*i+1] = r.Step(func() { runs.Add(1) })
		}()
	}
	wg.Wait()
	require.Equal(t, int32(2), runs.Load(), "two steps, each run once")
	require.Equal(t, []bool{true, true, true, true}, oks)

	// One party leaves before the step: the other runs it alone.
	r = NewRendezvous(2)
	done := make(chan bool)
	go func() { done <- r.Step(func() { runs.Add(1) }) }()
	r.Leave()
	require.True(t, <-done)
	require.Equal(t, int32(3), runs.Load())

	// The step ends its goroutine: the other party is released with false.
	r = NewRendezvous(2)
	other := make(chan bool)
	go func() { other <- r.Step(func() { t.Error("the party that arrived first ran the step") }) }()
	require.Eventually(t, func() bool { r.mu.Lock(); defer r.mu.Unlock(); return r.arrived == 1 }, 10*time.Second, time.Millisecond)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		r.Step(runtime.Goexit) // arrives last: runs the step, which ends it
		t.Error("Step returned after its step ended the goroutine")
	}()
	<-exited
	require.False(t, <-other, "the step did not return")
}
