package main

import (
	"bufio"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
)

// expectRules are the rules of scripts/test-expect.txt, which apply to
// every view of a run.
type expectRules struct {
	forbid     map[string]bool // no test (or subtest) of this name may run
	allowSkip  map[string]bool // subtests of this package may skip
	lineErrors []string
}

// parseExpect reads the expectations file. A `min <package> <n>` line, the
// per-package count this tool checked before it checked names, is accepted
// and ignored: the names file says more than any count.
func parseExpect(r io.Reader) expectRules {
	ru := expectRules{forbid: map[string]bool{}, allowSkip: map[string]bool{}}
	eachLine(r, func(n int, f []string, line string) {
		switch {
		case f[0] == "min" && len(f) == 3:
		case f[0] == "forbid" && len(f) == 2:
			ru.forbid[f[1]] = true
		case f[0] == "allow-skip" && len(f) == 2:
			ru.allowSkip[f[1]] = true
		default:
			ru.lineErrors = append(ru.lineErrors, fmt.Sprintf("expect line %d: unknown rule %q", n, line))
		}
	})
	return ru
}

// eachLine calls fn with the fields of every line that is not blank once
// its '#' comment is cut.
func eachLine(r io.Reader, fn func(n int, fields []string, line string)) {
	sc := bufio.NewScanner(r)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if i := strings.Index(line, "#"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		fn(n, strings.Fields(line), line)
	}
}

// ref names one test of one package.
type ref struct{ pkg, test string }

func (r ref) String() string { return r.pkg + " " + r.test }

// exclusion is a test that is not a test of its own (a crash test's child
// process), matched by package ("*": any) and a glob of its name.
type exclusion struct{ pkg, glob, reason string }

// selection is one `select` or `unselect` rule of a view.
type selection struct {
	pkg, glob string
	out       bool   // unselect
	reason    string // unselect's reason
}

// names is the names file: the listed tests and the rules about them.
type names struct {
	listed     map[ref]bool
	pkgs       map[string]bool // packages with a listed test
	exclude    []exclusion
	oneDB      map[ref]string // test -> why it may run one database only
	views      map[string][]selection
	lineErrors []string
}

// Keywords of the names file's rules; any other line is "<package> <test>".
const (
	kwExclude  = "exclude"
	kwOneDB    = "one-db"
	kwSelect   = "select"
	kwUnselect = "unselect"
)

func parseNames(r io.Reader) names {
	nm := names{listed: map[ref]bool{}, pkgs: map[string]bool{}, oneDB: map[ref]string{}, views: map[string][]selection{}}
	bad := func(n int, why, line string) {
		nm.lineErrors = append(nm.lineErrors, fmt.Sprintf("names line %d: %s: %q", n, why, line))
	}
	eachLine(r, func(n int, f []string, line string) {
		reason := func(from int) string { return strings.Join(f[from:], " ") }
		switch {
		case len(f) == 2:
			if !isTestName(f[1]) {
				bad(n, "not a test name", line)
				return
			}
			nm.listed[ref{f[0], f[1]}] = true
			nm.pkgs[f[0]] = true
		case f[0] == kwExclude && len(f) >= 4:
			if !validGlob(f[2]) {
				bad(n, "bad glob", line)
				return
			}
			nm.exclude = append(nm.exclude, exclusion{f[1], f[2], reason(3)})
		case f[0] == kwOneDB && len(f) >= 4:
			nm.oneDB[ref{f[1], f[2]}] = reason(3)
		case f[0] == kwSelect && len(f) == 4:
			if !validGlob(f[3]) {
				bad(n, "bad glob", line)
				return
			}
			nm.views[f[1]] = append(nm.views[f[1]], selection{pkg: f[2], glob: f[3]})
		case f[0] == kwUnselect && len(f) >= 5:
			nm.views[f[1]] = append(nm.views[f[1]], selection{pkg: f[2], glob: f[3], out: true, reason: reason(4)})
		default:
			bad(n, "unknown rule (a rule wants its reason)", line)
		}
	})
	// A rule that names a test must name a listed one: a renamed test
	// must not leave a rule behind that excuses nothing.
	for r := range nm.oneDB {
		if !nm.listed[r] {
			nm.lineErrors = append(nm.lineErrors, fmt.Sprintf("names: one-db names %s, which is not listed", r))
		}
	}
	for view, sels := range nm.views {
		for _, s := range sels {
			if s.out && !nm.listed[ref{s.pkg, s.glob}] {
				nm.lineErrors = append(nm.lineErrors, fmt.Sprintf("names: unselect %s names %s %s, which is not listed", view, s.pkg, s.glob))
			}
		}
	}
	for r := range nm.listed {
		if why, ok := nm.excluded(r); ok {
			nm.lineErrors = append(nm.lineErrors, fmt.Sprintf("names: %s is listed and excluded (%s)", r, why))
		}
	}
	sort.Strings(nm.lineErrors)
	return nm
}

func validGlob(g string) bool {
	_, err := path.Match(g, "")
	return err == nil
}

// excluded reports whether r is not a test of its own, and why.
func (nm names) excluded(r ref) (string, bool) {
	for _, e := range nm.exclude {
		if e.pkg != "*" && e.pkg != r.pkg {
			continue
		}
		if ok, _ := path.Match(e.glob, r.test); ok {
			return e.reason, true
		}
	}
	return "", false
}

// expected returns the tests a view must run and pass: every listed test
// for the view "" (the whole suite), else those its select rules take and
// its unselect rules do not leave out. left maps each test left out by an
// unselect rule to its reason.
func (nm names) expected(view string) (want map[ref]bool, left map[ref]string, err error) {
	if view == "" {
		return nm.listed, nil, nil
	}
	sels, ok := nm.views[view]
	if !ok {
		return nil, nil, fmt.Errorf("testguard: the names file has no select rule for view %q", view)
	}
	want, left = map[ref]bool{}, map[ref]string{}
	for r := range nm.listed {
		in, reason := false, ""
		for _, s := range sels {
			if s.pkg != r.pkg {
				continue
			}
			if ok, _ := path.Match(s.glob, r.test); ok {
				in, reason = !s.out, s.reason
			}
		}
		if in {
			want[r] = true
		} else if reason != "" {
			left[r] = reason
		}
	}
	for _, s := range sels {
		if s.out {
			continue
		}
		hit := false
		for r := range want {
			if ok, _ := path.Match(s.glob, r.test); ok && r.pkg == s.pkg {
				hit = true
				break
			}
		}
		if !hit {
			return nil, nil, fmt.Errorf("testguard: view %q: select %s %s takes no listed test", view, s.pkg, s.glob)
		}
	}
	return want, left, nil
}
