package schema_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// owners: the package that owns each table suffix and each persisted state.
// Nobody else may spell them in SQL or build a table name from them.
var owners = map[string]struct{ tables, states []string }{
	"txlog":    {[]string{"txlog"}, []string{"COMMITTED", "ROLLED_BACK"}},
	"outbox":   {[]string{"outbox"}, []string{"PENDING", "SENDING", "SENT", "RETRY", "DEAD"}},
	"consumer": {[]string{"consume_log", "consume_attempt", "aggregate_version", "dead_letter"}, []string{"SUCCESS", "STALE", "PARKED", "REPLAYED", "DISCARDED"}},
	"replay":   {[]string{"replay_audit", "replay_audit_item"}, []string{"RUNNING", "COMPLETED", "STOPPED", "FAILED"}},
}

// scanned: every library package and the CLI (examples are user code).
var scanned = []string{"txlog", "outbox", "consumer", "replay", "archive", "inspect", "checkback", "txproducer", "metrics", "schema", "cmd/rmqtx"}

var sqlWord = regexp.MustCompile(`\b(SELECT|INSERT|UPDATE|DELETE|FROM|JOIN|INTO|WHERE)\b`)

// TestOneOwnerPerTable fails when a package spells another package's table
// name or persisted state in SQL, or builds another package's table name
// from a prefix ("prefix + \"outbox\""): each table's owner exports what the
// others read, so a column or state changes in one place.
func TestOneOwnerPerTable(t *testing.T) {
	var problems []string
	for _, pkg := range scanned {
		files, err := filepath.Glob(filepath.Join("..", pkg, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, pkg)
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			problems = append(problems, scanFile(t, pkg, f)...)
		}
	}
	sort.Strings(problems)
	require.Empty(t, problems, "table names or states spelled outside their owner:\n%s", strings.Join(problems, "\n"))
}

func scanFile(t *testing.T, pkg, file string) []string {
	fset := token.NewFileSet()
	src, err := os.ReadFile(file)
	require.NoError(t, err)
	f, err := parser.ParseFile(fset, file, src, 0)
	require.NoError(t, err)
	var out []string
	foreign := func(s string, what func(owner string) []string, match func(s, name string) bool) (string, string, bool) {
		for owner := range owners {
			if owner == filepath.Base(pkg) {
				continue
			}
			for _, name := range what(owner) {
				if match(s, name) {
					return owner, name, true
				}
			}
		}
		return "", "", false
	}
	tables := func(owner string) []string { return owners[owner].tables }
	states := func(owner string) []string { return owners[owner].states }
	// A table in SQL text: after FROM, JOIN, INTO, UPDATE or TABLE (whatever
	// prefix is spelled before it), or with the default prefix anywhere.
	word := func(s, name string) bool {
		q := regexp.QuoteMeta(name)
		return regexp.MustCompile(`(?i)\b(FROM|JOIN|INTO|UPDATE|TABLE)\s+[A-Za-z0-9_]*` + q + `\b|\brmqtx_` + q + `\b`).MatchString(s)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BinaryExpr:
			// prefix + "outbox": a table name built by someone else.
			if x.Op != token.ADD {
				return true
			}
			if lit, ok := x.Y.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				if owner, name, ok := foreign(s, tables, func(s, name string) bool { return s == name }); ok {
					out = append(out, fset.Position(lit.Pos()).String()+": builds "+owner+"'s table "+name)
				}
			}
		case *ast.BasicLit:
			if x.Kind != token.STRING {
				return true
			}
			s, _ := strconv.Unquote(x.Value)
			if owner, name, ok := foreign(s, tables, word); ok && sqlWord.MatchString(s) {
				out = append(out, fset.Position(x.Pos()).String()+": SQL names "+owner+"'s table "+name)
			}
			// A state in SQL quotes, also in a WHERE fragment.
			if owner, name, ok := foreign(s, states, func(s, name string) bool { return strings.Contains(s, "'"+name+"'") }); ok {
				out = append(out, fset.Position(x.Pos()).String()+": SQL spells "+owner+"'s state "+name)
			}
		}
		return true
	})
	return out
}
