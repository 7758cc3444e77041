package main

// The README's code is tested here, so that what a reader copies compiles.
//
// The convention for ```go blocks in README.md:
//
//   - A block whose first line of code is a package clause is a whole file.
//     One of them must be this folder's main.go, byte for byte (the
//     quickstart; main.go is built and run by this package itself). Any other
//     is built as a package of its own.
//   - Any other go block is a fragment: the body of a function
//     func(ctx context.Context, db *sqlx.DB) error. It may use ctx and db,
//     and it may begin with an import declaration (blank driver imports, for
//     instance). The test imports every other package the fragment names
//     from fragmentImports (a name missing there fails the test, naming the
//     block), and adds "return nil" when the last statement is not a return.
//   - Blocks of other languages (sh, text, ...) are not checked.
//
// The blocks are built with `go build -overlay` as packages under this
// folder that exist only in the overlay, so they resolve rmqtx through this
// module's go.mod and nothing is written into the tree. The build flags
// follow this test binary's (-race, -tags failpoints), so the build reuses
// its compiled packages.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// readmeBuildFlags gains -race and -tags=failpoints when this test binary
// was built with them (race_test.go, failpoints_test.go).
var readmeBuildFlags []string

// fragmentImports maps the package names a fragment may use to their paths.
var fragmentImports = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "log": "log", "os": "os", "time": "time",
	"http": "net/http", "sql": "database/sql",
	"sqlx": "github.com/jmoiron/sqlx", "pgx": "github.com/jackc/pgx/v5", "stdlib": "github.com/jackc/pgx/v5/stdlib",
	"logrus": "github.com/sirupsen/logrus", "prometheus": "github.com/prometheus/client_golang/prometheus",
	"archive": "github.com/rmqtx/rmqtx/archive", "checkback": "github.com/rmqtx/rmqtx/checkback",
	"consumer": "github.com/rmqtx/rmqtx/consumer", "discard": "github.com/rmqtx/rmqtx/discard",
	"metrics": "github.com/rmqtx/rmqtx/metrics", "observe": "github.com/rmqtx/rmqtx/observe",
	"outbox": "github.com/rmqtx/rmqtx/outbox", "replay": "github.com/rmqtx/rmqtx/replay",
	"schema": "github.com/rmqtx/rmqtx/schema", "txlog": "github.com/rmqtx/rmqtx/txlog",
	"txproducer": "github.com/rmqtx/rmqtx/txproducer", "wire": "github.com/rmqtx/rmqtx/wire",
}

type codeBlock struct {
	line       int // of the opening fence, 1-based
	lang, text string
}

// fencedBlocks returns the fenced code blocks of a Markdown file.
func fencedBlocks(t *testing.T, path string) []codeBlock {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []codeBlock
	var cur *codeBlock
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &codeBlock{line: n, lang: strings.TrimSpace(strings.TrimPrefix(line, "```"))}
		case cur != nil && strings.TrimSpace(line) == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: code block never closed", path, cur.line)
	}
	return blocks
}

// isWholeFile reports whether src's first line of code is a package clause.
func isWholeFile(src string) bool {
	for _, l := range strings.Split(src, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "//") {
			continue
		}
		return strings.HasPrefix(l, "package ")
	}
	return false
}

// fragmentFile turns a fragment into a file of package readme with one
// function, fragment<n>.
func fragmentFile(n int, b codeBlock) (string, error) {
	lines := strings.Split(strings.TrimRight(b.text, "\n"), "\n")
	var decl []string // a leading import declaration
	if len(lines) > 0 && strings.HasPrefix(lines[0], "import") {
		end := 0
		if strings.HasPrefix(lines[0], "import (") {
			for end < len(lines) && strings.TrimSpace(lines[end]) != ")" {
				end++
			}
		}
		decl, lines = lines[:end+1], lines[end+1:]
	}
	body := strings.Join(lines, "\n")
	src := fmt.Sprintf("package readme\n\n%s\n\nfunc fragment%d(ctx context.Context, db *sqlx.DB) error {\n%s\n}\n",
		strings.Join(decl, "\n"), n, body)
	f, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
	if err != nil {
		return "", err
	}
	have := map[string]bool{}
	for _, im := range f.Imports {
		have[strings.Trim(im.Path.Value, `"`)] = true
	}
	need := map[string]bool{"context": true, "github.com/jmoiron/sqlx": true}
	for _, id := range f.Unresolved {
		if id.Name == "ctx" || id.Name == "db" || types.Universe.Lookup(id.Name) != nil {
			continue
		}
		path, ok := fragmentImports[id.Name]
		if !ok {
			return "", fmt.Errorf("names %q, which is neither declared in the block nor in fragmentImports", id.Name)
		}
		need[path] = true
	}
	var add []string
	for p := range need {
		if !have[p] {
			add = append(add, fmt.Sprintf("import %q", p))
		}
	}
	sort.Strings(add)
	fn := f.Decls[len(f.Decls)-1].(*ast.FuncDecl)
	if k := len(fn.Body.List); k == 0 {
		body += "\nreturn nil"
	} else if _, ok := fn.Body.List[k-1].(*ast.ReturnStmt); !ok {
		body += "\nreturn nil"
	}
	return fmt.Sprintf("package readme\n\n%s\n%s\n\nfunc fragment%d(ctx context.Context, db *sqlx.DB) error {\n%s\n}\n",
		strings.Join(decl, "\n"), strings.Join(add, "\n"), n, body), nil
}

// TestReadmeGoBlocks builds every Go block of README.md (see the file
// comment for the convention) and checks that the quickstart block is
// main.go as it is.
func TestReadmeGoBlocks(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mainGo, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	replace := map[string]string{}
	var pkgs []string
	quickstart, fragments, files, mains := false, 0, 0, 0
	for i, b := range fencedBlocks(t, filepath.Join(root, "README.md")) {
		if b.lang != "go" {
			continue
		}
		var dir, src string
		switch {
		case b.text == string(mainGo):
			quickstart = true
			continue
		case isWholeFile(b.text):
			files++
			if strings.Contains(b.text, "\npackage main\n") || strings.HasPrefix(b.text, "package main\n") {
				mains++
			}
			dir, src = fmt.Sprintf("readmecheck/file%d", i), b.text
		default:
			fragments++
			dir = "readmecheck/fragments"
			if src, err = fragmentFile(i, b); err != nil {
				t.Fatalf("README.md:%d: go fragment: %v", b.line, err)
			}
		}
		name := fmt.Sprintf("block%d_line%d.go", i, b.line)
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(root, "examples", "quickstart", dir, name)] = filepath.Join(tmp, name)
		if pkg := "./" + dir; !contains(pkgs, pkg) {
			pkgs = append(pkgs, pkg)
		}
	}
	if !quickstart {
		t.Fatal("README.md has no go block equal to examples/quickstart/main.go: copy main.go into the quickstart block as it is")
	}
	if fragments == 0 {
		t.Fatal("README.md has no go fragment: the reader of this test expects the Use it snippets")
	}
	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build README's blocks: %v", err)
	}
	args := []string{"build", "-overlay", ov}
	if mains > 0 { // main packages: their binaries go to a temporary folder
		args = append(args, "-o", t.TempDir())
	}
	args = append(args, readmeBuildFlags...)
	cmd := exec.Command(goBin, append(args, pkgs...)...)
	cmd.Dir = "."
	if out, err := cmd.CombinedOutput(); err != nil {
		// Errors name the temporary files; they carry the README line.
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("built %d fragment(s) and %d package(s); the quickstart block is main.go", fragments, len(pkgs))
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestReadmeLinks checks every relative link of README.md and TESTING.md:
// the file exists, and a #fragment names a heading of the target (as
// GitHub derives its anchors) or an explicit id.
func TestReadmeLinks(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := markdownAnchors(t, path)
		anchors[path] = a
		return a
	}
	for _, doc := range []string{"README.md", "TESTING.md"} {
		for _, l := range markdownLinks(t, filepath.Join(root, doc)) {
			target, frag, _ := strings.Cut(l.target, "#")
			path := filepath.Join(root, doc)
			if target != "" {
				path = filepath.Join(root, filepath.FromSlash(target))
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s:%d: link %q: %v", doc, l.line, l.target, err)
				continue
			}
			if frag == "" {
				continue
			}
			if !strings.HasSuffix(path, ".md") {
				t.Errorf("%s:%d: link %q: an anchor into a file that is not Markdown", doc, l.line, l.target)
			} else if !anchorsOf(path)[frag] {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", doc, l.line, l.target, filepath.Base(path), frag)
			}
		}
	}
}

type mdLink struct {
	line   int
	target string
}

var (
	linkRE       = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpanRE   = regexp.MustCompile("`[^`]*`")
	headingRE    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	explicitIDRE = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
)

// markdownLines calls fn for each line of path outside fenced code blocks.
func markdownLines(t *testing.T, path string, fn func(n int, line string)) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fenced := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			fn(n, line)
		}
	}
}

// markdownLinks returns the relative link targets of path (not URLs).
func markdownLinks(t *testing.T, path string) []mdLink {
	var links []mdLink
	markdownLines(t, path, func(n int, line string) {
		for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(line, ""), -1) {
			if !strings.Contains(m[1], "://") && !strings.HasPrefix(m[1], "mailto:") {
				links = append(links, mdLink{n, m[1]})
			}
		}
	})
	return links
}

// markdownAnchors returns the anchors GitHub gives path's headings: lower
// case, spaces to hyphens, punctuation other than - and _ dropped, and -1,
// -2 ... after a repeated one; plus explicit <a name|id="..."> anchors.
func markdownAnchors(t *testing.T, path string) map[string]bool {
	anchors, seen := map[string]bool{}, map[string]int{}
	markdownLines(t, path, func(_ int, line string) {
		for _, m := range explicitIDRE.FindAllStringSubmatch(line, -1) {
			anchors[m[1]] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			return
		}
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		slug := b.String()
		if k := seen[slug]; k > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, k)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	})
	return anchors
}
