package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// tally is what a run did.
type tally struct {
	// outcome holds, per package (relative to the module), every test and
	// subtest ("TestX/mysql") that ended, and how: "pass", "skip" or
	// "fail". A test reported twice keeps its worse end.
	outcome map[string]map[string]string
	failed  []string        // "pkg" (the package failed) or "pkg test", in stream order
	pkgs    map[string]bool // packages that reported a result
	// dbs holds, per package and top-level test, the kinds of database
	// ("mysql", "postgres") its output (its subtests' included) shows a
	// dbMarker line for: the databases testenv created for it.
	dbs map[string]map[string]map[string]bool
}

// dbMarker is testenv.DBMarker: testenv.MySQLDB and PostgresDB log it,
// followed by the database's kind and name, through t.Log for every
// database they create, and go test -json carries the line in the test's
// output. A copy, not an import: this tool must not build the test
// helpers (TestDBMarkerMatchesTestenv checks the two agree).
const dbMarker = "testenv: database "

// dbKind returns the kind of database an output line marks ("" for none).
func dbKind(output string) string {
	i := strings.Index(output, dbMarker)
	if i < 0 {
		return ""
	}
	f := strings.Fields(output[i+len(dbMarker):])
	if len(f) == 0 {
		return ""
	}
	for _, db := range databases {
		if f[0] == db {
			return db
		}
	}
	return ""
}

var rank = map[string]int{"pass": 1, "skip": 2, "fail": 3}

// read tallies a `go test -json` stream. With echo set it also writes, as
// the stream arrives, what a plain `go test` would print: every package's
// own lines ("ok", "FAIL", build errors) and the output of each test that
// fails; lines that are not JSON (a toolchain message) are echoed as they
// are.
func read(r io.Reader, module string, echo io.Writer) (tally, error) {
	t := tally{outcome: map[string]map[string]string{}, pkgs: map[string]bool{}, dbs: map[string]map[string]map[string]bool{}}
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
		pkg := relPkg(e.Package, module)
		key := e.Package + "\x00" + e.Test
		switch e.Action {
		case "output", "build-output":
			if kind := dbKind(e.Output); kind != "" && e.Test != "" {
				t.markDB(pkg, top(e.Test), kind)
			}
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
		if t.outcome[pkg] == nil {
			t.outcome[pkg] = map[string]string{}
		}
		if old := t.outcome[pkg][e.Test]; rank[e.Action] > rank[old] {
			t.outcome[pkg][e.Test] = e.Action
		}
		if e.Action == "fail" {
			t.failed = append(t.failed, pkg+" "+e.Test)
		}
	}
	if err := sc.Err(); err != nil {
		return t, fmt.Errorf("testguard: reading the go test -json stream: %w", err)
	}
	return t, nil
}

func (t *tally) markDB(pkg, test, kind string) {
	if t.dbs[pkg] == nil {
		t.dbs[pkg] = map[string]map[string]bool{}
	}
	if t.dbs[pkg][test] == nil {
		t.dbs[pkg][test] = map[string]bool{}
	}
	t.dbs[pkg][test][kind] = true
}

// relPkg is an import path relative to the module ("." for its root).
func relPkg(importPath, module string) string {
	if importPath == module {
		return "."
	}
	return strings.TrimPrefix(importPath, module+"/")
}

// top is the top-level test a test or subtest belongs to.
func top(test string) string {
	if i := strings.IndexByte(test, '/'); i >= 0 {
		return test[:i]
	}
	return test
}
