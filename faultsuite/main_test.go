//go:build failpoints

package faultsuite

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Flags. Zero values pick the CI defaults, or the soak defaults with -soak.
var (
	soakFlag      = flag.Bool("soak", false, "soak mode: larger defaults for -tx, -crashes-per-window and -storm-events")
	txFlag        = flag.Int("tx", 0, "minimum transactions attempted by the load phases, split between the crash matrix (1/2) and the two restarts (1/4 each); default 400, soak 10000")
	crashesFlag   = flag.Int("crashes-per-window", 0, "SIGKILLed subprocesses per failpoint window; default 3, soak 20")
	stormFlag     = flag.Int("storm-events", 0, "events in the duplicate storm (each sent 4 times); default 100, soak 2000")
	workersFlag   = flag.Int("workers", 4, "concurrent producer goroutines in the load phases")
	runDirFlag    = flag.String("run-dir", "", "run folder of the private services (default: a new temp folder, removed at the end)")
	summaryFlag   = flag.String("summary-file", filepath.Join(os.TempDir(), "rmqtx-faultsuite-summary.txt"), "also write the summary here (go test hides a passing package's output unless -v)")
	keepFlag      = flag.Bool("keep-services", false, "leave the private services running at the end (debugging; use with -run-dir to reuse them)")
	childWatchdog = 90 * time.Second
)

// Environment of the private services; each can be overridden.
const (
	envMySQLPort   = "RMQTX_FAULTSUITE_MYSQL_PORT"   // default 13307
	envNamesrvPort = "RMQTX_FAULTSUITE_NAMESRV_PORT" // default 19876
	envBrokerPort  = "RMQTX_FAULTSUITE_BROKER_PORT"  // default 20911 (uses 20909 and 20912 too)
	envRole        = "RMQTX_FAULTSUITE_ROLE"         // set in crash subprocesses
)

type params struct {
	tx, crashes, storm, workers int
}

func loadParams() params {
	p := params{tx: 400, crashes: 3, storm: 100, workers: *workersFlag}
	if *soakFlag {
		p = params{tx: 10000, crashes: 20, storm: 2000, workers: *workersFlag}
	}
	if *txFlag > 0 {
		p.tx = *txFlag
	}
	if *crashesFlag > 0 {
		p.crashes = *crashesFlag
	}
	if *stormFlag > 0 {
		p.storm = *stormFlag
	}
	if p.workers <= 0 {
		p.workers = 4
	}
	return p
}

var cfg params

// services drives scripts/services.sh against the private run folder.
type services struct {
	env    []string
	script string
	runDir string
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func newServices() (*services, error) {
	script, err := filepath.Abs(filepath.Join("..", "scripts", "services.sh"))
	if err != nil {
		return nil, err
	}
	runDir := *runDirFlag
	if runDir == "" {
		runDir, err = os.MkdirTemp("", "rmqtx-faultsuite-")
		if err != nil {
			return nil, err
		}
	}
	env := append(os.Environ(),
		"RMQTX_RUN_DIR="+runDir,
		"RMQTX_MYSQL_PORT="+envOr(envMySQLPort, "13307"),
		"RMQTX_NAMESRV_PORT="+envOr(envNamesrvPort, "19876"),
		"RMQTX_BROKER_PORT="+envOr(envBrokerPort, "20911"),
	)
	return &services{env: env, script: script, runDir: runDir}, nil
}

// run executes one services.sh command and returns its combined output.
func (s *services) run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{s.script}, args...)...)
	cmd.Env = s.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// exports returns the settings testenv reads, as printed by `env`.
func (s *services) exports() (map[string]string, error) {
	out, err := s.run("env")
	if err != nil {
		return nil, fmt.Errorf("services.sh env: %w: %s", err, out)
	}
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		if ok {
			m[k] = v
		}
	}
	return m, nil
}

// reaper starts a detached shell that stops the private services and removes
// the run folder if this process dies without doing it (a -timeout panic or a
// kill). Its output goes nowhere so `go test` does not wait for it.
func (s *services) reaper(removeDir bool) error {
	script := `while kill -0 "$WATCH" 2>/dev/null; do sleep 2; done; bash "$SCRIPT" down >/dev/null 2>&1`
	if removeDir {
		script += `; rm -rf "$RMQTX_RUN_DIR"`
	}
	cmd := exec.Command("setsid", "bash", "-c", script)
	cmd.Env = append(s.env, "WATCH="+strconv.Itoa(os.Getpid()), "SCRIPT="+s.script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

var private *services

func TestMain(m *testing.M) {
	flag.Parse()
	cfg = loadParams()
	if os.Getenv(envRole) != "" || testing.Short() {
		// A crash subprocess (it inherits the parent's settings), or a
		// unit-only run (every test here skips under -short).
		os.Exit(m.Run())
	}
	os.Exit(runWithPrivateServices(m))
}

func runWithPrivateServices(m *testing.M) int {
	start := time.Now()
	s, err := newServices()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultsuite:", err)
		return 1
	}
	private = s
	removeDir := *runDirFlag == ""
	if !*keepFlag {
		if err := s.reaper(removeDir); err != nil {
			fmt.Fprintln(os.Stderr, "faultsuite: reaper:", err)
			return 1
		}
	}
	out, err := s.run("up")
	if err != nil {
		fmt.Fprintf(os.Stderr, "faultsuite: starting the private services failed: %v\n%s\n", err, out)
		logs, _ := s.run("logs")
		fmt.Fprintln(os.Stderr, logs)
		_, _ = s.run("down")
		return 1
	}
	exp, err := s.exports()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faultsuite:", err)
		return 1
	}
	// testenv reads these at first use; the crash subprocesses inherit them.
	for _, k := range []string{"RMQTX_MYSQL_ADDR", "RMQTX_MYSQL_USER", "RMQTX_MYSQL_PASSWORD", "RMQTX_NAMESRV", "RMQTX_BROKER"} {
		if err := os.Setenv(k, exp[k]); err != nil {
			fmt.Fprintln(os.Stderr, "faultsuite:", err)
			return 1
		}
	}
	report.servicesUp = time.Since(start)
	report.runDir = s.runDir
	code := m.Run()
	sum := report.String()
	fmt.Print(sum)
	if *summaryFlag != "" && sum != "" {
		if err := os.WriteFile(*summaryFlag, []byte(sum), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "faultsuite: summary file:", err)
		}
	}
	if !*keepFlag {
		if out, err := s.run("down"); err != nil {
			fmt.Fprintf(os.Stderr, "faultsuite: stopping the private services: %v\n%s\n", err, out)
		}
		if removeDir {
			_ = os.RemoveAll(s.runDir)
		}
	}
	fmt.Printf("faultsuite: total %s (private services up in %s)\n", time.Since(start).Round(time.Second), report.servicesUp.Round(time.Second))
	return code
}
