// Command testguard reads the `go test -json` stream of a suite run and
// fails when the run did not run the proof: a test was skipped, a package
// listed in the expectations file ran fewer passing tests than its minimum
// (or did not run at all), or a test that must never run in CI ran (such as
// TestFailpointsNotCompiled, which means the failpoints tag was missing). A
// green `go test` alone says only that nothing failed; testguard says that
// what had to run, ran.
//
// Usage:
//
//	testguard -expect scripts/test-expect.txt -json .run/go-test.json [-module github.com/rmqtx/rmqtx]
//
// The expectations file has one rule per line ('#' starts a comment):
//
//	min <package> <n>     at least n top-level tests of <package> passed
//	forbid <TestName>     no package may run a test of that name
//	allow-skip <package>  skips are allowed in <package> (none by default)
//
// <package> is relative to the module ("txproducer", "internal/testenv").
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// rules are the expectations of a run.
type rules struct {
	min        map[string]int
	forbid     map[string]bool
	allowSkip  map[string]bool
	minPkgs    []string
	lineErrors []string
}

func parseRules(r io.Reader) rules {
	ru := rules{min: map[string]int{}, forbid: map[string]bool{}, allowSkip: map[string]bool{}}
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, "#"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		switch {
		case f[0] == "min" && len(f) == 3:
			v, err := strconv.Atoi(f[2])
			if err != nil || v < 1 {
				ru.lineErrors = append(ru.lineErrors, fmt.Sprintf("line %d: min wants a positive count: %q", n, line))
				continue
			}
			ru.min[f[1]] = v
			ru.minPkgs = append(ru.minPkgs, f[1])
		case f[0] == "forbid" && len(f) == 2:
			ru.forbid[f[1]] = true
		case f[0] == "allow-skip" && len(f) == 2:
			ru.allowSkip[f[1]] = true
		default:
			ru.lineErrors = append(ru.lineErrors, fmt.Sprintf("line %d: unknown rule %q", n, line))
		}
	}
	return ru
}

// tally is what a run did, per package (relative to the module).
type tally struct {
	passed  map[string]int      // top-level tests passed
	skipped map[string][]string // tests (and subtests) skipped
	ran     map[string][]string // package -> tests that ran (any outcome), for forbid
	failed  []string
	pkgs    map[string]bool // packages that reported a result
}

// read tallies a `go test -json` stream. With echo set it also writes, as
// the stream arrives, what a plain `go test` would print: every package's
// own lines ("ok", "FAIL", build errors) and the output of each test that
// fails; lines that are not JSON (a toolchain message) are echoed as they
// are.
func read(r io.Reader, module string, echo io.Writer) (tally, error) {
	t := tally{passed: map[string]int{}, skipped: map[string][]string{}, ran: map[string][]string{}, pkgs: map[string]bool{}}
	held := map[string][]string{} // package + test -> its output, until it ends
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			if echo != nil {
				fmt.Fprintln(echo, string(line))
			}
			continue
		}
		pkg := strings.TrimPrefix(strings.TrimPrefix(e.Package, module), "/")
		if pkg == "" {
			pkg = "."
		}
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "output", "build-output":
			if echo != nil {
				if e.Test == "" {
					fmt.Fprint(echo, e.Output)
				} else {
					held[key] = append(held[key], e.Output)
				}
			}
			continue
		case "pass", "fail", "skip":
		default:
			continue
		}
		if echo != nil && e.Test != "" {
			if e.Action == "fail" {
				fmt.Fprint(echo, strings.Join(held[key], ""))
			}
			delete(held, key)
		}
		if e.Test == "" {
			t.pkgs[pkg] = true
			if e.Action == "fail" {
				t.failed = append(t.failed, pkg)
			}
			continue
		}
		t.ran[pkg] = append(t.ran[pkg], e.Test)
		switch e.Action {
		case "pass":
			if !strings.Contains(e.Test, "/") {
				t.passed[pkg]++
			}
		case "skip":
			t.skipped[pkg] = append(t.skipped[pkg], e.Test)
		case "fail":
			t.failed = append(t.failed, pkg+" "+e.Test)
		}
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("testguard: reading the go test -json stream: %w", err)
	}
	return t, nil
}

// check returns every way the run falls short of the rules.
func check(ru rules, t tally) []string {
	problems := append([]string{}, ru.lineErrors...)
	for _, f := range t.failed {
		problems = append(problems, "failed: "+f)
	}
	for _, pkg := range ru.minPkgs {
		if got := t.passed[pkg]; got < ru.min[pkg] {
			if !t.pkgs[pkg] {
				problems = append(problems, fmt.Sprintf("%s: did not run (want at least %d passing tests)", pkg, ru.min[pkg]))
			} else {
				problems = append(problems, fmt.Sprintf("%s: %d tests passed, want at least %d", pkg, got, ru.min[pkg]))
			}
		}
	}
	pkgs := make([]string, 0, len(t.skipped))
	for pkg := range t.skipped {
		pkgs = append(pkgs, pkg)
	}
	sort.Strings(pkgs)
	for _, pkg := range pkgs {
		if !ru.allowSkip[pkg] {
			problems = append(problems, fmt.Sprintf("%s: skipped %s", pkg, strings.Join(t.skipped[pkg], ", ")))
		}
	}
	for pkg, tests := range t.ran {
		for _, name := range tests {
			if ru.forbid[name] {
				problems = append(problems, fmt.Sprintf("%s: ran %s, which must never run here", pkg, name))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

func main() {
	expect := flag.String("expect", "scripts/test-expect.txt", "expectations file")
	js := flag.String("json", "", "go test -json output (default stdin)")
	module := flag.String("module", "github.com/rmqtx/rmqtx", "module path, stripped from package names")
	echo := flag.Bool("echo", false, "print what a plain go test would (package lines, failing tests' output) while reading")
	flag.Parse()
	rf, err := os.Open(*expect)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testguard:", err)
		os.Exit(2)
	}
	ru := parseRules(rf)
	_ = rf.Close()
	in := io.Reader(os.Stdin)
	if *js != "" {
		f, err := os.Open(*js)
		if err != nil {
			fmt.Fprintln(os.Stderr, "testguard:", err)
			os.Exit(2)
		}
		defer f.Close()
		in = f
	}
	var out io.Writer
	if *echo {
		out = os.Stdout
	}
	t, err := read(in, *module, out)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	total := 0
	for _, n := range t.passed {
		total += n
	}
	problems := check(ru, t)
	for _, pkg := range ru.minPkgs {
		fmt.Printf("testguard: %-28s %4d passed (min %d)\n", pkg, t.passed[pkg], ru.min[pkg])
	}
	fmt.Printf("testguard: %d packages, %d top-level tests passed, %d skipped\n", len(t.pkgs), total, countSkips(t))
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Println("testguard: FAIL:", p)
		}
		os.Exit(1)
	}
	fmt.Println("testguard: PASS: every expected suite ran, nothing was skipped")
}

func countSkips(t tally) int {
	n := 0
	for _, s := range t.skipped {
		n += len(s)
	}
	return n
}
