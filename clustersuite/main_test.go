//go:build failpoints

package clustersuite

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

var (
	runDirFlag  = flag.String("run-dir", "", "run folder of the private cluster (default: a new temp folder, removed at the end)")
	summaryFlag = flag.String("summary-file", filepath.Join(os.TempDir(), "rmqtx-clustersuite-summary.txt"), "also write the summary here (go test hides a passing package's output unless -v)")
	keepFlag    = flag.Bool("keep-services", false, "leave the private cluster running at the end (debugging; use with -run-dir to reuse it)")
)

// Environment of the private cluster; each can be overridden.
const (
	envMySQLPort   = "RMQTX_CLUSTERSUITE_MYSQL_PORT"   // default 23307
	envNamesrvPort = "RMQTX_CLUSTERSUITE_NAMESRV_PORT" // default 29876
	envBrokerPort  = "RMQTX_CLUSTERSUITE_BROKER_PORT"  // default 30911 (broker-b: +100; each uses port-2 and port+1 too)
)

// services drives scripts/services.sh (RMQTX_BROKERS=2) against the
// private run folder.
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
		runDir, err = os.MkdirTemp("", "rmqtx-clustersuite-")
		if err != nil {
			return nil, err
		}
	}
	brokerPort, err := strconv.Atoi(envOr(envBrokerPort, "30911"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envBrokerPort, err)
	}
	env := append(os.Environ(),
		"RMQTX_RUN_DIR="+runDir,
		"RMQTX_BROKERS=2",
		"RMQTX_MYSQL_PORT="+envOr(envMySQLPort, "23307"),
		"RMQTX_NAMESRV_PORT="+envOr(envNamesrvPort, "29876"),
		"RMQTX_BROKER_PORT="+strconv.Itoa(brokerPort),
		"RMQTX_BROKER_B_PORT="+strconv.Itoa(brokerPort+100),
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

// exports returns the settings as printed by `env`.
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

// reaper starts a detached shell that stops the private cluster and removes
// the run folder if this process dies without doing it (a -timeout panic or
// a kill). Its output goes nowhere so `go test` does not wait for it.
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

// private is the suite's cluster; brokerA and brokerB are its brokers'
// addresses (services "broker" and "broker-b" of services.sh).
var (
	private          *services
	brokerA, brokerB string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv(envRole) != "" || testing.Short() {
		// A child process (it inherits the parent's settings), or a
		// unit-only run (every test here skips under -short).
		os.Exit(m.Run())
	}
	os.Exit(runWithPrivateCluster(m))
}

func runWithPrivateCluster(m *testing.M) int {
	start := time.Now()
	s, err := newServices()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustersuite:", err)
		return 1
	}
	private = s
	removeDir := *runDirFlag == ""
	if !*keepFlag {
		if err := s.reaper(removeDir); err != nil {
			fmt.Fprintln(os.Stderr, "clustersuite: reaper:", err)
			return 1
		}
	}
	out, err := s.run("up")
	if err != nil {
		fmt.Fprintf(os.Stderr, "clustersuite: starting the private cluster failed: %v\n%s\n", err, out)
		logs, _ := s.run("logs")
		fmt.Fprintln(os.Stderr, logs)
		_, _ = s.run("down")
		return 1
	}
	exp, err := s.exports()
	if err != nil {
		fmt.Fprintln(os.Stderr, "clustersuite:", err)
		return 1
	}
	// testenv reads these at first use.
	for _, k := range []string{"RMQTX_MYSQL_ADDR", "RMQTX_MYSQL_USER", "RMQTX_MYSQL_PASSWORD", "RMQTX_NAMESRV", "RMQTX_BROKER", "RMQTX_BROKER_B"} {
		if exp[k] == "" {
			fmt.Fprintf(os.Stderr, "clustersuite: services.sh env printed no %s (is RMQTX_BROKERS=2 supported?)\n", k)
			return 1
		}
		if err := os.Setenv(k, exp[k]); err != nil {
			fmt.Fprintln(os.Stderr, "clustersuite:", err)
			return 1
		}
	}
	brokerA, brokerB = exp["RMQTX_BROKER"], exp["RMQTX_BROKER_B"]
	report.servicesUp = time.Since(start)
	code := m.Run()
	sum := report.String()
	fmt.Print(sum)
	if *summaryFlag != "" && sum != "" {
		if err := os.WriteFile(*summaryFlag, []byte(sum), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "clustersuite: summary file:", err)
		}
	}
	if !*keepFlag {
		if out, err := s.run("down"); err != nil {
			fmt.Fprintf(os.Stderr, "clustersuite: stopping the private cluster: %v\n%s\n", err, out)
		}
		if removeDir {
			_ = os.RemoveAll(s.runDir)
		}
	}
	fmt.Printf("clustersuite: total %s (private cluster up in %s)\n", time.Since(start).Round(time.Second), report.servicesUp.Round(time.Second))
	return code
}
