// Command testguard reads the `go test -json` stream of a suite run and
// fails when the run did not run the proof. A green `go test` alone says
// only that nothing failed; testguard says that what had to run, ran, by
// name:
//
//   - every test listed in the names file (scripts/test-names.txt) for the
//     view being checked ran and passed, and no test ran that it does not
//     list, so the list cannot go stale;
//   - every test that ran subtests named mysql or postgres (testenv.EachDB)
//     passed both, unless a one-db rule of the names file says why not;
//   - no test used one kind of database only: testenv logs a marker line
//     ("testenv: database mysql ...") for every database it creates, and
//     a test whose output shows one kind and not the other fails unless a
//     one-db rule names it (a rule whose test used both fails too);
//   - nothing was skipped, and no test passed with all its subtests
//     skipped;
//   - no test ran that must never run (a forbid rule of the expectations
//     file: TestFailpointsNotCompiled means the failpoints tag was missing).
//
// A -short run (the upstream build's unit step) may skip listed tests but
// must still report each one, and is not held to the database rule, which
// -short turns off.
//
// Usage:
//
//	testguard [-echo] [-short] [-view NAME] -expect scripts/test-expect.txt -names scripts/test-names.txt [-json FILE]
//	testguard -write-names scripts/test-names.txt
//	testguard -list [-view NAME]   (the tests the view requires)
//
// -write-names rewrites the names file from the test sources of `go list
// -tags failpoints ./...` (run it at the module root), keeping its
// hand-kept rules; the file's header describes them. The expectations file
// has one rule per line ('#' starts a comment):
//
//	forbid <TestName>     no package may run a test of that name
//	allow-skip <package>  subtests of <package> may skip (a listed test must still pass)
//	min <package> <n>     obsolete (a count of passing tests); accepted and ignored
//
// <package> is relative to the module ("txproducer", "internal/testenv").
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
)

func main() {
	expect := flag.String("expect", "scripts/test-expect.txt", "expectations file")
	namesFile := flag.String("names", "scripts/test-names.txt", "names file: the tests a run must run and pass")
	view := flag.String("view", "", "check the names file's view `NAME` (its select rules) instead of every listed test")
	short := flag.Bool("short", false, "the run used -short: listed tests may skip, but each must be reported")
	js := flag.String("json", "", "go test -json output (default stdin)")
	module := flag.String("module", "github.com/rmqtx/rmqtx", "module path, stripped from package names")
	echo := flag.Bool("echo", false, "print what a plain go test would (package lines, failing tests' output) while reading")
	write := flag.String("write-names", "", "rewrite `FILE` from the module's test sources and exit")
	tags := flag.String("tags", "failpoints", "build tags for -write-names (those make test uses)")
	list := flag.Bool("list", false, "print the tests the view requires, one \"<package> <test>\" a line, and exit")
	flag.Parse()
	if *write != "" {
		if err := writeNames(*write, *module, *tags); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	nm, err := readFile(*namesFile, func(r io.Reader) names { return parseNames(r) })
	if err != nil {
		fail(err)
	}
	if *list {
		if len(nm.lineErrors) > 0 {
			fail(fmt.Errorf("%s: %s", *namesFile, strings.Join(nm.lineErrors, "; ")))
		}
		want, _, err := nm.expected(*view)
		if err != nil {
			fail(err)
		}
		refs := make([]string, 0, len(want))
		for r := range want {
			refs = append(refs, r.String())
		}
		sort.Strings(refs)
		for _, r := range refs {
			fmt.Println(r)
		}
		return
	}
	ex, err := readFile(*expect, func(r io.Reader) expectRules { return parseExpect(r) })
	if err != nil {
		fail(err)
	}
	in := io.Reader(os.Stdin)
	if *js != "" {
		f, err := os.Open(*js)
		if err != nil {
			fail(err)
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
		fail(err)
	}
	rep := check(ex, nm, mode{view: *view, short: *short}, t)
	name := "the whole suite"
	if *view != "" {
		name = "view " + *view
	}
	if *short {
		name += " (-short)"
	}
	fmt.Printf("testguard: %s: %d listed tests in %d packages; %d passed, %d skipped; %d tests passed on both databases, %d used one database by a one-db rule\n",
		name, rep.want, len(t.pkgs), rep.passed, rep.skipped, rep.bothDBs, rep.oneDB)
	if len(rep.problems) > 0 {
		for _, p := range rep.problems {
			fmt.Println("testguard: FAIL:", p)
		}
		os.Exit(1)
	}
	if *short {
		fmt.Println("testguard: PASS: every listed test ran, none failed, no other test ran")
		return
	}
	fmt.Println("testguard: PASS: every listed test ran and passed, nothing was skipped, no other test ran")
}

func readFile[T any](name string, parse func(io.Reader) T) (T, error) {
	var zero T
	f, err := os.Open(name)
	if err != nil {
		return zero, err
	}
	defer f.Close()
	return parse(f), nil
}

func fail(err error) {
	msg := err.Error()
	if !strings.HasPrefix(msg, "testguard:") {
		msg = "testguard: " + msg
	}
	fmt.Fprintln(os.Stderr, msg)
	os.Exit(2)
}
