package upgradetest

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// rule is one line of testdata/rules.txt.
type rule struct {
	line int
	kind string   // unwrap, observe, rename, migrate, gofmt
	args []string // the words after the kind; for gofmt, the rule text
}

func parseRules(text string) ([]rule, error) {
	var rules []rule
	for i, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		kind, rest, _ := strings.Cut(l, " ")
		r := rule{line: i + 1, kind: kind, args: strings.Fields(rest)}
		want := map[string]func(n int) bool{
			"unwrap":  func(n int) bool { return n == 2 },
			"observe": func(n int) bool { return n >= 2 },
			"rename":  func(n int) bool { return n == 3 },
			"migrate": func(n int) bool { return n == 2 },
			"gofmt":   func(n int) bool { return strings.Contains(rest, " -> ") },
		}[kind]
		if want == nil || !want(len(r.args)) {
			return nil, fmt.Errorf("rules.txt:%d: malformed rule %q", r.line, l)
		}
		if kind == "gofmt" {
			r.args = []string{rest}
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// edit replaces src[start:end] with text.
type edit struct {
	start, end int
	text       string
}

// apply applies non-overlapping edits and formats the result.
func apply(src []byte, edits []edit) ([]byte, error) {
	sort.Slice(edits, func(i, j int) bool { return edits[i].start > edits[j].start })
	out := slices.Clone(src)
	for _, e := range edits {
		out = slices.Concat(out[:e.start:e.start], []byte(e.text), out[e.end:])
	}
	f, err := format.Source(out)
	if err != nil {
		return nil, fmt.Errorf("%w\n%s", err, out)
	}
	return f, nil
}

// rewriter applies rules to one Go file and counts what each rule changed.
type rewriter struct {
	gofmt string // path of the gofmt binary
}

// run applies r to src and reports how many places it changed.
func (rw rewriter) run(r rule, src []byte) ([]byte, int, error) {
	if r.kind == "gofmt" {
		return rw.runGofmt(r.args[0], src)
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "main.go", src, parser.ParseComments)
	if err != nil {
		return nil, 0, err
	}
	off := func(p token.Pos) int { return fset.Position(p).Offset }
	text := func(n ast.Node) string { return string(src[off(n.Pos()):off(n.End())]) }
	var edits []edit
	switch r.kind {
	case "unwrap", "observe", "rename":
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.CompositeLit)
			if !ok || lit.Type == nil || text(lit.Type) != r.args[0] {
				return true
			}
			switch r.kind {
			case "unwrap":
				edits = append(edits, unwrapEdits(src, lit, r.args[1], off)...)
			case "observe":
				edits = append(edits, observeEdits(src, lit, r.args[1:], off, text)...)
			case "rename":
				for _, kv := range keyed(lit, r.args[1]) {
					edits = append(edits, edit{off(kv.Key.Pos()), off(kv.Key.End()), r.args[2]})
				}
			}
			return true
		})
	case "migrate":
		edits = migrateEdits(f, r.args[0], r.args[1], off, text)
	}
	if len(edits) == 0 {
		return src, 0, nil
	}
	out, err := apply(src, edits)
	return out, len(edits), err
}

// keyed returns the elements of lit keyed by one of names.
func keyed(lit *ast.CompositeLit, names ...string) []*ast.KeyValueExpr {
	var kvs []*ast.KeyValueExpr
	for _, e := range lit.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok && slices.Contains(names, id.Name) {
				kvs = append(kvs, kv)
			}
		}
	}
	return kvs
}

// throughComma returns the offset just past the comma that follows i
// (blanks skipped), or i when no comma follows.
func throughComma(src []byte, i int) int {
	j := i
	for j < len(src) && (src[j] == ' ' || src[j] == '\t' || src[j] == '\n') {
		j++
	}
	if j < len(src) && src[j] == ',' {
		return j + 1
	}
	return i
}

// ownLine returns the offset of the newline before i when only blanks stand
// between them (the element at i is alone on its line), else i: removing
// from there leaves no blank line behind.
func ownLine(src []byte, i int) int {
	j := i
	for j > 0 && (src[j-1] == ' ' || src[j-1] == '\t') {
		j--
	}
	if j > 0 && src[j-1] == '\n' {
		return j - 1
	}
	return i
}

// unwrapEdits turns field: X{a, b} inside lit into a, b.
func unwrapEdits(src []byte, lit *ast.CompositeLit, field string, off func(token.Pos) int) []edit {
	var edits []edit
	for _, kv := range keyed(lit, field) {
		inner, ok := kv.Value.(*ast.CompositeLit)
		if !ok {
			continue
		}
		if len(inner.Elts) == 0 {
			edits = append(edits, edit{ownLine(src, off(kv.Pos())), throughComma(src, off(kv.End())), ""})
			continue
		}
		edits = append(edits, edit{ownLine(src, off(kv.Pos())), off(inner.Lbrace) + 1, ""})
		// A multi-line inner literal ends its last element with a comma of
		// its own; the comma after its brace would then be a second one.
		end := off(inner.Rbrace) + 1
		last := off(inner.Elts[len(inner.Elts)-1].End())
		if bytes.ContainsRune(src[last:off(inner.Rbrace)], '\n') {
			end = throughComma(src, end)
		}
		edits = append(edits, edit{ownLine(src, off(inner.Rbrace)), end, ""})
	}
	return edits
}

// observeEdits moves the keyed fields into Observe: observe.Observe{...}.
func observeEdits(src []byte, lit *ast.CompositeLit, fields []string, off func(token.Pos) int, text func(ast.Node) string) []edit {
	kvs := keyed(lit, fields...)
	if len(kvs) == 0 {
		return nil
	}
	var parts []string
	for _, kv := range kvs {
		parts = append(parts, text(kv))
	}
	edits := []edit{{off(kvs[0].Pos()), off(kvs[0].End()), "Observe: observe.Observe{" + strings.Join(parts, ", ") + "}"}}
	for _, kv := range kvs[1:] {
		edits = append(edits, edit{ownLine(src, off(kv.Pos())), throughComma(src, off(kv.End())), ""})
	}
	return edits
}

// migrateEdits turns s.Migrate(ctx), where s, err := ctor(db, prefix) in the
// same function, into schema.Migrate(ctx, db, schema.Options{Prefix:
// prefix, Components: []schema.Component{schema.<component>}}).
func migrateEdits(f *ast.File, ctor, component string, off func(token.Pos) int, text func(ast.Node) string) []edit {
	var edits []edit
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		made := map[string][]string{} // variable -> the constructor's arguments
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			as, ok := n.(*ast.AssignStmt)
			if !ok || len(as.Rhs) != 1 {
				return true
			}
			call, ok := as.Rhs[0].(*ast.CallExpr)
			if !ok || text(call.Fun) != ctor || len(call.Args) != 2 {
				return true
			}
			if id, ok := as.Lhs[0].(*ast.Ident); ok {
				made[id.Name] = []string{text(call.Args[0]), text(call.Args[1])}
			}
			return true
		})
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 1 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || sel.Sel.Name != "Migrate" {
				return true
			}
			id, ok := sel.X.(*ast.Ident)
			if !ok || made[id.Name] == nil {
				return true
			}
			db, prefix := made[id.Name][0], made[id.Name][1]
			edits = append(edits, edit{off(call.Pos()), off(call.End()), fmt.Sprintf(
				"schema.Migrate(%s, %s, schema.Options{Prefix: %s, Components: []schema.Component{schema.%s}})",
				text(call.Args[0]), db, prefix, component)})
			return true
		})
	}
	return edits
}

// runGofmt runs gofmt -r on src and counts the lines that changed.
func (rw rewriter) runGofmt(ruleText string, src []byte) ([]byte, int, error) {
	dir, err := os.MkdirTemp("", "upgrade-gofmt")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	p := filepath.Join(dir, "main.go")
	if err := os.WriteFile(p, src, 0o600); err != nil {
		return nil, 0, err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(rw.gofmt, "-r", ruleText, p)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, 0, fmt.Errorf("gofmt -r %q: %w: %s", ruleText, err, stderr.String())
	}
	changed := 0
	a, b := strings.Split(string(src), "\n"), strings.Split(string(out), "\n")
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			changed++
		}
	}
	return out, changed, nil
}

// fixImports adds the rmqtx packages the rules refer to and drops the
// imports nothing uses any more: what goimports does for the guide's reader.
func fixImports(src []byte, module string) ([]byte, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "main.go", src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && id.Obj == nil {
				used[id.Name] = true
			}
		}
		return true
	})
	imported := map[string]bool{}
	var edits []edit
	for _, spec := range f.Imports {
		path, _ := strconv.Unquote(spec.Path.Value)
		name := filepath.Base(path)
		if spec.Name != nil {
			name = spec.Name.Name
		}
		imported[name] = true
		if !used[name] && name != "_" {
			edits = append(edits, edit{ownLine(src, fset.Position(spec.Pos()).Offset), fset.Position(spec.End()).Offset, ""})
		}
	}
	var add []string
	for _, pkg := range []string{"discard", "observe", "schema"} {
		if used[pkg] && !imported[pkg] {
			add = append(add, strconv.Quote(module+"/"+pkg))
		}
	}
	if len(add) > 0 {
		if len(f.Imports) == 0 {
			return nil, fmt.Errorf("no import declaration to add %v to", add)
		}
		last := f.Imports[len(f.Imports)-1]
		at := fset.Position(last.End()).Offset
		edits = append(edits, edit{at, at, "\n" + strings.Join(add, "\n")})
	}
	return apply(src, edits)
}
