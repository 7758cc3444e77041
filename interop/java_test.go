package interop

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// howToBuild is printed when the Java programs are missing.
const howToBuild = "build the Java interop programs with `scripts/interop-java.sh` " +
	"(needs OpenJDK 17 and Maven; `make test` runs it); `go test -short` runs only the unit tests"

// repoRoot is the repository root (this file is in <root>/interop).
func repoRoot(t testing.TB) string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("interop: cannot locate the source tree")
	}
	return filepath.Dir(filepath.Dir(file))
}

// cacheDir mirrors scripts/services.sh and scripts/interop-java.sh.
func cacheDir() string {
	if d := os.Getenv("RMQTX_CACHE_DIR"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "rmqtx")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "rmqtx")
}

// sourceHash mirrors source_hash in scripts/interop-java.sh: sha256sum lines
// ("<hex>  <path>\n") of pom.xml and every .java file under src/, sorted
// bytewise by path relative to the root, hashed again, first 16 hex digits.
func sourceHash(root string) (string, error) {
	files := []string{"interop/java/pom.xml"}
	err := filepath.WalkDir(filepath.Join(root, "interop/java/src"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && strings.HasSuffix(p, ".java") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	slices.Sort(files)
	var list bytes.Buffer
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(b)
		fmt.Fprintf(&list, "%s  %s\n", hex.EncodeToString(sum[:]), f)
	}
	sum := sha256.Sum256(list.Bytes())
	return hex.EncodeToString(sum[:])[:16], nil
}

// javaEnv finds java and the build of the current sources; a test FAILS
// (does not skip) without them, like testenv does for the services.
func javaEnv(t testing.TB) (javaBin, classpath string) {
	t.Helper()
	javaBin, err := exec.LookPath("java")
	if err != nil {
		t.Fatalf("interop: java not found on PATH: %v\n%s", err, howToBuild)
	}
	h, err := sourceHash(repoRoot(t))
	if err != nil {
		t.Fatalf("interop: hash the Java sources: %v", err)
	}
	dir := filepath.Join(cacheDir(), "interop-java", h)
	if _, err := os.Stat(filepath.Join(dir, ".complete")); err != nil {
		t.Fatalf("interop: no build of the current Java sources in %s\n%s", dir, howToBuild)
	}
	return javaBin, filepath.Join(dir, "classes") + string(os.PathListSeparator) + filepath.Join(dir, "lib", "*")
}

// javaProc is one Java program, started once per scenario. Its stdout lines
// (tab-separated fields) are collected; it stops when its stdin is closed.
type javaProc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer

	mu     sync.Mutex
	lines  [][]string
	cond   chan struct{} // closed and replaced on every line
	exited bool
	done   chan struct{}
}

// startJava runs class (in package io.github.rmqtx.interop) with args.
func startJava(t testing.TB, class string, args ...string) *javaProc {
	t.Helper()
	javaBin, cp := javaEnv(t)
	logDir := t.TempDir()
	jvm := []string{
		"-Xms32m", "-Xmx192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss512k",
		// the client's own log files go to the test's temp dir, not ~/logs
		"-Drocketmq.client.logRoot=" + logDir, "-Drocketmq.client.logLevel=WARN", "-Duser.home=" + logDir,
		"-cp", cp, "io.github.rmqtx.interop." + class,
	}
	cmd := exec.Command(javaBin, append(jvm, args...)...)
	j := &javaProc{t: t, name: class, cmd: cmd, cond: make(chan struct{}), done: make(chan struct{})}
	cmd.Stderr = &syncWriter{mu: &j.mu, w: &j.stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("interop: %s: %v", class, err)
	}
	if j.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatalf("interop: %s: %v", class, err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("interop: start %s: %v\n%s", class, err, howToBuild)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			j.mu.Lock()
			j.lines = append(j.lines, strings.Split(sc.Text(), "\t"))
			close(j.cond)
			j.cond = make(chan struct{})
			j.mu.Unlock()
		}
		_ = cmd.Wait()
		j.mu.Lock()
		j.exited = true
		close(j.cond)
		j.cond = make(chan struct{})
		j.mu.Unlock()
		close(j.done)
	}()
	t.Cleanup(j.stop)
	return j
}

type syncWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// Lines returns a copy of the lines read so far.
func (j *javaProc) Lines() [][]string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.lines)
}

// WaitFor polls cond over the lines until it holds; it fails the test with
// the program's stderr tail when the deadline passes or the program exits.
func (j *javaProc) WaitFor(timeout time.Duration, what string, cond func(lines [][]string) bool) {
	j.t.Helper()
	deadline := time.After(timeout)
	for {
		j.mu.Lock()
		ok, exited, ch := cond(j.lines), j.exited, j.cond
		j.mu.Unlock()
		if ok {
			return
		}
		if exited {
			j.t.Fatalf("interop: %s exited before %s\n%s", j.name, what, j.stderrTail())
		}
		select {
		case <-ch:
		case <-deadline:
			j.t.Fatalf("interop: %s: %s not reached within %s\n%s", j.name, what, timeout, j.stderrTail())
		}
	}
}

// WaitLine waits for a line whose first field is tag.
func (j *javaProc) WaitLine(timeout time.Duration, tag string) {
	j.t.Helper()
	j.WaitFor(timeout, "line "+tag, func(lines [][]string) bool {
		return slices.ContainsFunc(lines, func(l []string) bool { return l[0] == tag })
	})
}

func (j *javaProc) stderrTail() string {
	j.mu.Lock()
	defer j.mu.Unlock()
	s := j.stderr.String()
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return "stderr of " + j.name + ":\n" + s
}

// stop closes stdin (the programs shut their clients down and exit) and
// kills the JVM only if it does not exit in time.
func (j *javaProc) stop() {
	_ = j.stdin.Close()
	select {
	case <-j.done:
	case <-time.After(20 * time.Second):
		_ = j.cmd.Process.Kill()
		<-j.done
		j.t.Logf("interop: %s did not exit after stdin closed; killed", j.name)
	}
}

// TestSourceHashMatchesScript: the Go side finds the build the script made.
func TestSourceHashMatchesScript(t *testing.T) {
	out, err := exec.Command("bash", filepath.Join(repoRoot(t), "scripts/interop-java.sh"), "path").Output()
	if err != nil {
		t.Fatalf("scripts/interop-java.sh path: %v", err)
	}
	h, err := sourceHash(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	if got := filepath.Base(strings.TrimSpace(string(out))); got != h {
		t.Fatalf("script hash %s, Go hash %s", got, h)
	}
}
