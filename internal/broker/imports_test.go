package broker

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The guard of the seam: no package outside internal/broker imports
// rocketmq-client-go, so every call into the client, and every workaround
// for it, is found here.
//
// Allowed besides the seam (module-relative folders, each with everything
// under it): code whose job is to be the raw client or to check rmqtx
// against it, never library code a service runs.
//
// Test files (_test.go) are not checked: a test may build the client
// itself, as an independent witness of what rmqtx sent or stored. So are
// third_party (the patched client itself), testdata, vendor, hidden folders
// and nested modules: they are not this module's packages.
var clientAllowed = []string{
	"internal/broker",  // the seam
	"rmqmsg",           // the seam's public face: names of the client's value types, no behaviour
	"cmd/rmqtx-bench",  // the benchmark's raw-client side, measured against rmqtx
	"rmqtxtest",        // the test kit: an in-process broker and witnesses
	"internal/testenv", // test helpers: witnesses built on the client
	"suites",           // the fault, cluster and conformance suites and their bed: witnesses
	"internal/tools",   // test tooling (service readiness, the test guard)
	"interop",          // interoperability checks with plain client users
}

// clientModule is the client's module path; its v2 and any other major
// version start with it.
const clientModule = "github.com/apache/rocketmq-client-go"

// isClient reports whether import path p is the client or one of its
// packages.
func isClient(p string) bool {
	return p == clientModule || strings.HasPrefix(p, clientModule+"/")
}

// allowedDir reports whether rel (a slash-separated module-relative folder)
// is, or is under, an allowed folder.
func allowedDir(rel string) bool {
	for _, a := range clientAllowed {
		if rel == a || strings.HasPrefix(rel, a+"/") {
			return true
		}
	}
	return false
}

// clientImports returns "file: import path" for every non-test Go file of
// the module rooted at root, outside the allowed folders, that imports the
// client, sorted.
func clientImports(root string) ([]string, error) {
	var out []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
				name == "testdata" || name == "vendor" || name == "third_party" || allowedDir(rel) {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // a nested module
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if isClient(p) {
				out = append(out, rel+": "+p)
			}
		}
		return nil
	})
	sort.Strings(out)
	return out, err
}

// moduleRoot is the folder of the go.mod above the working directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		up := filepath.Dir(dir)
		if up == dir {
			t.Fatal("no go.mod above the working directory")
		}
		dir = up
	}
}

// Every non-test file outside the seam (and the allowed tooling) reaches
// the client through internal/broker only.
func TestNoPackageOutsideTheSeamImportsTheClient(t *testing.T) {
	root := moduleRoot(t)
	found, err := clientImports(root)
	require.NoError(t, err)
	if len(found) > 0 {
		t.Fatalf("these files import rocketmq-client-go outside internal/broker; use the seam's types and constructors instead, and put any workaround for the client in the seam:\n\t%s",
			strings.Join(found, "\n\t"))
	}
	// The walk did see the module: the seam's own files import the client.
	_, err = os.Stat(filepath.Join(root, "internal", "broker", "types.go"))
	require.NoError(t, err)
}

// The guard reports a planted import of the client's root package or any
// of its packages, at any depth and whatever the build tags, including in a
// folder whose name only starts like an allowed one (internal/brokerage).
// It ignores test files, the allowed folders and code that is not this
// module's (third_party, testdata, hidden folders, nested modules).
func TestImportGuardReportsAPlantedImport(t *testing.T) {
	root := t.TempDir()
	write := func(rel, src string) {
		p := filepath.Join(root, filepath.FromSlash(rel))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(src), 0o644))
	}
	imp := func(pkg, path string) string {
		return "package " + pkg + "\n\nimport (\n\t\"fmt\"\n\n\t_ \"" + path + "\"\n)\n\nvar _ = fmt.Sprint\n"
	}
	write("go.mod", "module example.com/planted\n")
	// Offenders.
	write("outbox/leak.go", imp("outbox", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write("consumer/sub/deep.go", imp("sub", "github.com/apache/rocketmq-client-go/v2"))
	write("internal/brokerage/near.go", imp("brokerage", "github.com/apache/rocketmq-client-go/v2/producer"))
	write("cmd/rmqtx/main.go", "package main\n\nimport rmq \"github.com/apache/rocketmq-client-go/v2/admin\"\n\nvar _ = rmq.NewAdmin\n")
	write("failpointed.go", "//go:build failpoints\n\npackage planted\n\nimport _ \"github.com/apache/rocketmq-client-go/v2/consumer\"\n")
	// Not offenders.
	write("outbox/witness_test.go", imp("outbox", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write("internal/broker/seam.go", imp("broker", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write("internal/broker/remoting/wire.go", imp("remoting", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write("cmd/rmqtx-bench/raw.go", imp("main", "github.com/apache/rocketmq-client-go/v2"))
	write("internal/tools/svcready/main.go", imp("main", "github.com/apache/rocketmq-client-go/v2/admin"))
	write("third_party/rocketmq-client-go/api.go", imp("rocketmq", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write("outbox/testdata/sample.go", imp("sample", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write(".run/upstream/x.go", imp("x", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write("nested/go.mod", "module example.com/nested\n")
	write("nested/n.go", imp("nested", "github.com/apache/rocketmq-client-go/v2/primitive"))
	write("consumer/clean.go", imp("consumer", "github.com/rmqtx/rmqtx/internal/broker"))
	write("consumer/notes.txt", "import \"github.com/apache/rocketmq-client-go/v2\"\n")

	found, err := clientImports(root)
	require.NoError(t, err)
	require.Equal(t, []string{
		"cmd/rmqtx/main.go: github.com/apache/rocketmq-client-go/v2/admin",
		"consumer/sub/deep.go: github.com/apache/rocketmq-client-go/v2",
		"failpointed.go: github.com/apache/rocketmq-client-go/v2/consumer",
		"internal/brokerage/near.go: github.com/apache/rocketmq-client-go/v2/producer",
		"outbox/leak.go: github.com/apache/rocketmq-client-go/v2/primitive",
	}, found)

	// A file that does not parse is an error, not a pass.
	write("outbox/broken.go", "package outbox\n\nimport (\n")
	_, err = clientImports(root)
	require.Error(t, err)
}
