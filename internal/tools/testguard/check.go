package main

import (
	"fmt"
	"sort"
	"strings"
)

// Subtest names of testenv.EachDB (testenv.DBMySQL, testenv.DBPostgres).
var databases = []string{"mysql", "postgres"}

// mode is how a run is judged.
type mode struct {
	view  string // a view of the names file; "" is every listed test
	short bool   // a -short run: listed tests may skip, and nothing runs a database
}

// report is the verdict on a run.
type report struct {
	problems []string
	want     int // tests the view lists
	passed   int // of those, passed
	skipped  int // of those, skipped (-short)
	bothDBs  int // tests that ran on both databases
	oneDB    int // tests that used one database, as a one-db rule allows
}

// check returns every way the run falls short of the rules.
func check(ex expectRules, nm names, m mode, t tally) report {
	var rep report
	add := func(format string, a ...any) { rep.problems = append(rep.problems, fmt.Sprintf(format, a...)) }
	rep.problems = append(rep.problems, ex.lineErrors...)
	rep.problems = append(rep.problems, nm.lineErrors...)
	want, left, err := nm.expected(m.view)
	if err != nil {
		add("%v", err)
		return rep
	}
	rep.want = len(want)
	for _, f := range t.failed {
		add("failed: %s", f)
	}

	// Every listed test ran and passed (under -short: ran, and passed or
	// skipped).
	for r := range want {
		switch o := t.outcome[r.pkg][r.test]; {
		case o == "pass":
			rep.passed++
		case o == "skip" && m.short:
			rep.skipped++
		case o == "skip":
			add("%s: %s was skipped; it is listed and must run and pass", r.pkg, r.test)
		case o == "":
			add("%s: %s did not run; it is listed and must run and pass", r.pkg, r.test)
		}
	}

	for _, pkg := range sortedKeys(t.outcome) {
		tests := t.outcome[pkg]
		var skipped []string
		for _, test := range sortedKeys(tests) {
			r := ref{pkg, top(test)}
			if ex.forbid[test] {
				add("%s: ran %s, which must never run here", pkg, test)
			}
			if _, ok := nm.excluded(r); ok {
				continue
			}
			if test == r.test && !want[r] {
				switch why, ok := left[r]; {
				case ok:
					add("%s: ran %s, which view %s leaves out (%s)", pkg, test, m.view, why)
				case nm.listed[r]:
					add("%s: ran %s, which view %s does not list", pkg, test, m.view)
				default:
					add("%s: ran %s, which the names file does not list (regenerate it: %s)", pkg, test, regenerate)
				}
			}
			if tests[test] == "skip" && test != r.test && !m.short && !ex.allowSkip[pkg] {
				skipped = append(skipped, test)
			}
		}
		if len(skipped) > 0 {
			add("%s: skipped %s", pkg, strings.Join(skipped, ", "))
		}
		if !m.short {
			rep.bothDBs += checkSubtests(pkg, tests, nm, add)
			rep.oneDB += checkMarkers(pkg, t.dbs[pkg], nm, add)
		}
	}
	sort.Strings(rep.problems)
	return rep
}

// checkSubtests fails a test (or subtest) that ran a database half
// (testenv.EachDB) without passing both, unless a one-db rule gives the
// reason, and a test that passed although every subtest it ran was skipped.
// It returns how many tests passed on both databases.
func checkSubtests(pkg string, tests map[string]string, nm names, add func(string, ...any)) int {
	children := map[string][]string{} // parent -> the last elements of its subtests
	for test := range tests {
		if i := strings.LastIndexByte(test, '/'); i >= 0 {
			children[test[:i]] = append(children[test[:i]], test[i+1:])
		}
	}
	both := 0
	for _, parent := range sortedKeys(children) {
		kids := children[parent]
		if _, ok := nm.excluded(ref{pkg, top(parent)}); ok {
			continue
		}
		halves := 0
		for _, k := range kids {
			for _, db := range databases {
				if k == db {
					halves++
				}
			}
		}
		if halves > 0 {
			var short []string
			for _, db := range databases {
				switch o := tests[parent+"/"+db]; o {
				case "pass":
				case "":
					short = append(short, db+" did not run")
				case "skip":
					short = append(short, db+" was skipped")
				default:
					short = append(short, db+" failed")
				}
			}
			_, oneDB := nm.oneDB[ref{pkg, top(parent)}]
			switch {
			case len(short) == 0:
				both++
			case !oneDB:
				add("%s: %s must pass on both databases: %s", pkg, parent, strings.Join(short, ", "))
			}
		}
		if tests[parent] == "pass" {
			all := true
			for _, k := range kids {
				all = all && tests[parent+"/"+k] == "skip"
			}
			if all {
				add("%s: %s passed, but every one of its %d subtests was skipped", pkg, parent, len(kids))
			}
		}
	}
	return both
}

// checkMarkers fails a top-level test whose output shows databases of one
// kind only (testenv's dbMarker lines: it, or its subtests, used MariaDB
// and never PostgreSQL, or the other way round) unless a one-db rule says
// why the test is about that one database; and a one-db rule whose test
// used both, which excuses nothing any more. This is what makes running on
// both databases the default: testenv.DB or MySQLDB in a new test fails
// the suite until the test runs on both (testenv.EachDB) or says why not.
// It returns how many tests used one database by a rule.
func checkMarkers(pkg string, dbs map[string]map[string]bool, nm names, add func(string, ...any)) int {
	one := 0
	for _, test := range sortedKeys(dbs) {
		r := ref{pkg, test}
		if _, ok := nm.excluded(r); ok {
			continue
		}
		kinds := sortedKeys(dbs[test])
		why, ruled := nm.oneDB[r]
		switch {
		case len(kinds) == 1 && ruled:
			one++
		case len(kinds) == 1:
			add("%s: %s used a %s database only (its output has %q and no other kind): run it on both (testenv.EachDB) or give it a rule \"one-db %s %s <why>\" in the names file",
				pkg, test, kinds[0], dbMarker+kinds[0], pkg, test)
		case ruled:
			add("%s: %s used both databases, but a one-db rule excuses it (%s): remove the rule", pkg, test, why)
		}
	}
	return one
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
