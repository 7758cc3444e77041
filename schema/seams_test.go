package schema_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
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
// Nobody else may spell them in SQL, pass them as bare strings, or build a
// table name from them.
var owners = map[string]struct{ tables, states []string }{
	"txlog":    {[]string{"txlog"}, []string{"COMMITTED", "ROLLED_BACK"}},
	"outbox":   {[]string{"outbox"}, []string{"PENDING", "SENDING", "SENT", "RETRY", "DEAD"}},
	"consumer": {[]string{"consume_log", "consume_attempt", "consume_window", "aggregate_version", "dead_letter"}, []string{"SUCCESS", "STALE", "PARKED", "REPLAYED", "DISCARDED", "RETRYING"}},
	"replay":   {[]string{"replay_audit", "replay_audit_item"}, []string{"RUNNING", "COMPLETED", "STOPPED", "FAILED"}},
}

// notLibrary are the folders that are not library code: user code
// (examples, the bench, whose raw sides are what a user writes by hand),
// test support, vendored code, and the one place dialect SQL lives.
var notLibrary = []string{"examples", "cmd/rmqtx-bench", "third_party", "internal/testenv", "suites",
	"internal/testscript", "internal/tools", "internal/configtest", "internal/dialect", "interop", "deploy", "docker"}

// mysqlOnly are tokens of MySQL/MariaDB SQL that no library package may
// use outside internal/dialect and the owners' migrations (which are .sql
// files, never scanned).
var mysqlOnly = regexp.MustCompile(`(?i)ON DUPLICATE KEY|LAST_INSERT_ID|GET_LOCK|RELEASE_LOCK|UTC_TIMESTAMP|INSERT IGNORE|REPLACE INTO|@@SESSION|` +
	`LOCK IN SHARE MODE|TIMESTAMPDIFF|INTERVAL \? MICROSECOND|ENGINE\s*=|\bDATABASE\(\)|\bSHA2\(|USING ascii`)

// postgresOnly are the same for PostgreSQL's SQL.
var postgresOnly = regexp.MustCompile(`(?i)ON CONFLICT|\bEXCLUDED\.|pg_(try_)?advisory|current_setting\(|statement_timestamp|clock_timestamp|` +
	`::[a-z]|\bxmax\b|\bBYTEA\b|\bRETURNING [A-Za-z(]`)

var sqlWord = regexp.MustCompile(`\b(SELECT|INSERT|UPDATE|DELETE|FROM|JOIN|INTO|WHERE)\b`)

// TestSeams fails when a library package spells another package's table,
// state or column export, or MySQL- or PostgreSQL-only SQL outside the
// dialect.
func TestSeams(t *testing.T) {
	problems, files := seamViolations(t, "..")
	require.Greater(t, files, 50, "the scan must cover the library's files")
	require.Empty(t, problems, "seam violations:\n%s", strings.Join(problems, "\n"))
}

// TestSeamsCatchPlantedViolations proves the scan fails on each kind of
// violation, planted in a scratch tree laid out like the repository.
func TestSeamsCatchPlantedViolations(t *testing.T) {
	for name, src := range map[string]string{
		"sprintf table": `package inspect
import "fmt"
func q(p string) string { return fmt.Sprintf("SELECT 1 FROM %soutbox", p) }`,
		"concatenated table": `package archive
func n(p string) string { return p + "dead_letter" }`,
		"state in sql": `package inspect
const q = "SELECT n FROM t WHERE status = 'RETRYING'"`,
		"bare state comparison": `package archive
func f(s string) bool { return s == "SENT" }`,
		"column export": `package txlog
const ColEventID = "event_id"`,
		"mysql in internal": `package retire
const q = "INSERT IGNORE INTO t VALUES (1)"`,
		"mysql driver import": `package outbox
import _ "github.com/go-sql-driver/mysql"`,
		"postgres in a library": `package outbox
const q = "INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING"`,
		"pgx import": `package txlog
import _ "github.com/jackc/pgx/v5/stdlib"`,
		"internal type in an exported signature": `package txlog
import "github.com/rmqtx/rmqtx/internal/migrate"
func Steps() []migrate.Part { return nil }`,
		"exported alias of an internal type": `package txlog
import "github.com/rmqtx/rmqtx/internal/migrate"
type Part = migrate.Part`,
		"mysql error type": `package consumer
import "github.com/go-sql-driver/mysql"
var _ *mysql.MySQLError`,
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			pkg := strings.TrimPrefix(strings.SplitN(src, "\n", 2)[0], "package ")
			dir := filepath.Join(root, pkg)
			if pkg == "retire" {
				dir = filepath.Join(root, "internal", pkg)
			}
			require.NoError(t, os.MkdirAll(dir, 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "x.go"), []byte(src+"\n"), 0o644))
			problems, files := seamViolations(t, root)
			require.Equal(t, 1, files)
			require.NotEmpty(t, problems, "the planted violation must be found")
		})
	}
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(recv *ast.FieldList) bool {
	if recv == nil || len(recv.List) == 0 {
		return true
	}
	t := recv.List[0].Type
	if st, ok := t.(*ast.StarExpr); ok {
		t = st.X
	}
	if ix, ok := t.(*ast.IndexExpr); ok {
		t = ix.X
	}
	id, ok := t.(*ast.Ident)
	return ok && id.IsExported()
}

// seamViolations scans every non-test .go file of the library under root.
func seamViolations(t *testing.T, root string) (problems []string, files int) {
	t.Helper()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") && rel != "." || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			for _, skip := range notLibrary {
				if rel == skip {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		files++
		problems = append(problems, scanFile(t, filepath.Base(filepath.Dir(path)), path)...)
		return nil
	})
	require.NoError(t, err)
	sort.Strings(problems)
	return problems, files
}

// driverUsers may open connections with the MySQL driver (DSN parsing,
// connectors): programs and the local environment, not library packages.
var driverUsers = []string{"cmd/rmqtx", "internal/localenv"}

func scanFile(t *testing.T, pkg, file string) []string {
	rel := filepath.ToSlash(filepath.Dir(file))
	opensConnections := false
	for _, d := range driverUsers {
		if strings.HasSuffix(rel, "/"+d) {
			opensConnections = true
		}
	}
	fset := token.NewFileSet()
	src, err := os.ReadFile(file)
	require.NoError(t, err)
	f, err := parser.ParseFile(fset, file, src, 0)
	require.NoError(t, err)
	var out []string
	at := func(n ast.Node) string { return fset.Position(n.Pos()).String() }
	foreign := func(s string, what func(owner string) []string, match func(s, name string) bool) (string, string, bool) {
		for owner := range owners {
			if owner == pkg {
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
	// prefix or %s is spelled before it), or with the default prefix.
	word := func(s, name string) bool {
		q := regexp.QuoteMeta(name)
		return regexp.MustCompile(`(?i)\b(FROM|JOIN|INTO|UPDATE|TABLE)\s+[%A-Za-z0-9_]*` + q + `\b|\brmqtx_` + q + `\b`).MatchString(s)
	}
	for _, imp := range f.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p == "github.com/go-sql-driver/mysql" && !opensConnections {
			out = append(out, at(imp)+": imports the MySQL driver outside internal/dialect")
		} else if strings.HasPrefix(p, "github.com/jackc/pgx/") && !opensConnections {
			out = append(out, at(imp)+": imports pgx outside internal/dialect")
		}
	}
	// Internal packages imported by this file, by the name the file uses.
	internal := map[string]string{}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if !strings.Contains(p, "/internal/") || !strings.HasPrefix(p, "github.com/rmqtx/rmqtx/") {
			continue
		}
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		internal[name] = p
	}
	mentionsInternal := func(n ast.Node) string {
		found := ""
		if n == nil {
			return ""
		}
		ast.Inspect(n, func(m ast.Node) bool {
			if sel, ok := m.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && internal[id.Name] != "" && found == "" {
					found = id.Name + "." + sel.Sel.Name
				}
			}
			return found == ""
		})
		return found
	}
	if !strings.Contains(filepath.ToSlash(file), "/internal/") && !strings.Contains(filepath.ToSlash(file), "/cmd/") && f.Name.Name != "main" {
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || (d.Recv != nil && !exportedRecv(d.Recv)) {
					continue
				}
				if m := mentionsInternal(d.Type); m != "" {
					out = append(out, at(d)+": exported "+d.Name.Name+" has internal type "+m+" in its signature")
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					if ts, ok := sp.(*ast.TypeSpec); ok && ts.Name.IsExported() && ts.Assign.IsValid() {
						if m := mentionsInternal(ts.Type); m != "" {
							out = append(out, at(ts)+": exported alias "+ts.Name.Name+" names internal type "+m)
						}
					}
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.ValueSpec:
			for _, id := range x.Names {
				if regexp.MustCompile(`^Col[A-Z]`).MatchString(id.Name) {
					out = append(out, at(id)+": exports column name "+id.Name+" (owners call functions, they do not export columns)")
				}
			}
		case *ast.SelectorExpr:
			if id, ok := x.X.(*ast.Ident); ok && id.Name == "mysql" && !opensConnections {
				out = append(out, at(x)+": uses mysql."+x.Sel.Name+" outside internal/dialect")
			}
		case *ast.BinaryExpr:
			// status == "SENT": a state compared as a bare string.
			if x.Op == token.EQL || x.Op == token.NEQ {
				for _, side := range []ast.Expr{x.X, x.Y} {
					if lit, ok := side.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						if owner, name, ok := foreign(s, states, func(s, name string) bool { return s == name }); ok {
							out = append(out, at(lit)+": compares with "+owner+"'s state "+name+" (use the owner's constant)")
						}
					}
				}
				return true
			}
			// prefix + "outbox": a table name built by someone else.
			if x.Op != token.ADD {
				return true
			}
			if lit, ok := x.Y.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				s, _ := strconv.Unquote(lit.Value)
				if owner, name, ok := foreign(s, tables, func(s, name string) bool { return s == name }); ok {
					out = append(out, at(lit)+": builds "+owner+"'s table "+name)
				}
			}
		case *ast.BasicLit:
			if x.Kind != token.STRING {
				return true
			}
			s, _ := strconv.Unquote(x.Value)
			if owner, name, ok := foreign(s, tables, word); ok && sqlWord.MatchString(s) {
				out = append(out, at(x)+": SQL names "+owner+"'s table "+name)
			}
			// fmt.Sprintf("%soutbox", prefix): a built name.
			if owner, name, ok := foreign(s, tables, func(s, name string) bool {
				return regexp.MustCompile(`%[sv]` + regexp.QuoteMeta(name) + `\b`).MatchString(s)
			}); ok {
				out = append(out, at(x)+": formats "+owner+"'s table "+name)
			}
			// A state in SQL quotes.
			if owner, name, ok := foreign(s, states, func(s, name string) bool { return strings.Contains(s, "'"+name+"'") }); ok {
				out = append(out, at(x)+": spells "+owner+"'s state "+name+" in SQL")
			}
			if m := mysqlOnly.FindString(s); m != "" {
				out = append(out, at(x)+": MySQL-only SQL "+strconv.Quote(m)+" outside internal/dialect")
			}
			if m := postgresOnly.FindString(s); m != "" {
				out = append(out, at(x)+": PostgreSQL-only SQL "+strconv.Quote(m)+" outside internal/dialect")
			}
		}
		return true
	})
	return out
}
