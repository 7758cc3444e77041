package hasuite

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

const (
	suiteName = "hasuite"
	// envPrefix names the variables that override the HA bed's ports:
	// RMQTX_HASUITE_NAMESRV_PORT and RMQTX_HASUITE_BROKER_PORT (n0; n1
	// listens 100 above, the controller 2 above the name server).
	envPrefix = "RMQTX_HASUITE"
	// Default ports: below Linux's ephemeral range, clear of the other
	// suites' (faultsuite 19876/20911, clustersuite 29876/30911/31011) and
	// of the private brokers of package tests (17076-18711).
	defaultNamesrvPort = 27876
	defaultBrokerPort  = 28911
	// A bed's connection pool, topic queues and a load worker's pause after
	// an error (an outage is then a series of clear errors, not a busy loop).
	dbConns         = 48
	queuesPerBroker = 4
	errorPause      = 500 * time.Millisecond
)

// Suite is the run: the HA bed and the summary.
type Suite struct {
	Report *Summary
	ha     *haBed

	runDir, summaryFile *string
	keep                *bool
}

var suite = &Suite{
	Report:      &Summary{},
	runDir:      flag.String("run-dir", "", "run folder of the HA bed (default: a new temp folder, removed at the end)"),
	summaryFile: flag.String("summary-file", filepath.Join(os.TempDir(), "rmqtx-"+suiteName+"-summary.txt"), "also write the summary here (go test hides a passing package's output unless -v)"),
	keep:        flag.Bool("keep-services", false, "leave the HA bed running at the end (debugging; use with -run-dir to reuse it)"),
}

func init() {
	suite.Report.Title = func() string {
		if suite.ha == nil {
			return "rmqtx HA suite summary"
		}
		return fmt.Sprintf("rmqtx HA suite summary: one controller-mode replica set (n0 %s, n1 %s), controller embedded in the name server %s",
			suite.ha.addr["n0"], suite.ha.addr["n1"], suite.ha.namesrv)
	}
}

func TestMain(m *testing.M) { os.Exit(suite.main(m)) }

// haBed is the HA bed of scripts/services.sh (RMQTX_BROKERS=ha) in a run
// folder of the suite's own: a name server with the controller embedded and
// the replicas n0 and n1 of broker-a. The databases are the shared ones
// (testenv's settings): nothing here stops them.
type haBed struct {
	env        []string
	script     string
	runDir     string
	namesrv    string
	controller string
	addr       map[string]string // node -> host:port
}

// Run executes one services.sh command against the bed and returns its
// combined output.
func (h *haBed) Run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{h.script}, args...)...)
	cmd.Env = h.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// state runs the controller probe services.sh built (internal/tools/hastate)
// with args; its output names the master ("master=n0 ...") and each node's
// role.
func (h *haBed) state(args ...string) (string, error) {
	base := []string{"-controller", h.controller, "-broker-name", "broker-a",
		"-node", "n0=" + h.addr["n0"], "-node", "n1=" + h.addr["n1"]}
	out, err := exec.Command(filepath.Join(h.runDir, "bin", "hastate"), append(base, args...)...).CombinedOutput()
	return string(out), err
}

// master returns the node the controller made master ("" when none).
func (h *haBed) master() string {
	out, err := h.state("-master-only", "-timeout", "5s")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// other is the node that is not n.
func other(n string) string {
	if n == "n0" {
		return "n1"
	}
	return "n0"
}

func envInt(k string, def int) (int, error) {
	v := os.Getenv(k)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", k, err)
	}
	return n, nil
}

func (s *Suite) newHABed() (*haBed, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	runDir := *s.runDir
	if runDir == "" {
		if runDir, err = os.MkdirTemp("", "rmqtx-"+suiteName+"-"); err != nil {
			return nil, err
		}
	}
	ns, err := envInt(envPrefix+"_NAMESRV_PORT", defaultNamesrvPort)
	if err != nil {
		return nil, err
	}
	n0, err := envInt(envPrefix+"_BROKER_PORT", defaultBrokerPort)
	if err != nil {
		return nil, err
	}
	// The short check settings of the other suites: FenceAge 4 s, a half
	// nobody answers is discarded after about 13 s.
	env := append(os.Environ(), "RMQTX_RUN_DIR="+runDir, "RMQTX_BROKERS=ha",
		"RMQTX_NAMESRV_PORT="+strconv.Itoa(ns), "RMQTX_BROKER_PORT="+strconv.Itoa(n0),
		"RMQTX_BROKER_B_PORT="+strconv.Itoa(n0+100), "RMQTX_CONTROLLER_PORT="+strconv.Itoa(ns+2),
		"RMQTX_TX_TIMEOUT_MS=3000", "RMQTX_TX_CHECK_INTERVAL_MS=2000", "RMQTX_TX_CHECK_MAX=5")
	return &haBed{env: env, script: filepath.Join(root, "scripts", "services.sh"), runDir: runDir,
		namesrv: fmt.Sprintf("127.0.0.1:%d", ns), controller: fmt.Sprintf("127.0.0.1:%d", ns+2),
		addr: map[string]string{"n0": fmt.Sprintf("127.0.0.1:%d", n0), "n1": fmt.Sprintf("127.0.0.1:%d", n0+100)}}, nil
}

// reaper starts a detached shell that stops the bed and removes its run
// folder if this process dies without doing it (a -timeout panic, a kill).
func (h *haBed) reaper(removeDir bool) error {
	script := `while kill -0 "$WATCH" 2>/dev/null; do sleep 2; done; bash "$SCRIPT" down namesrv n0 n1 >/dev/null 2>&1`
	if removeDir {
		script += `; rm -rf "$RMQTX_RUN_DIR"`
	}
	cmd := exec.Command("setsid", "bash", "-c", script)
	cmd.Env = append(append([]string{}, h.env...), "WATCH="+strconv.Itoa(os.Getpid()), "SCRIPT="+h.script)
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// main starts the HA bed, points testenv's name server at it, runs the
// tests, prints and writes the summary, and stops the bed. -short only runs
// the tests (each skips).
func (s *Suite) main(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() || testenv.InChild() {
		return m.Run()
	}
	start := time.Now()
	h, err := s.newHABed()
	if err != nil {
		fmt.Fprintln(os.Stderr, suiteName+":", err)
		return 1
	}
	removeDir := *s.runDir == ""
	if !*s.keep {
		if err := h.reaper(removeDir); err != nil {
			fmt.Fprintln(os.Stderr, suiteName+": reaper:", err)
			return 1
		}
	}
	if out, err := h.Run("up", "namesrv", "n0", "n1"); err != nil {
		logs, _ := h.Run("logs", "namesrv", "n0", "n1")
		fmt.Fprintf(os.Stderr, "%s: starting the HA bed failed: %v\n%s\n%s\n", suiteName, err, out, logs)
		_, _ = h.Run("down", "namesrv", "n0", "n1")
		return 1
	}
	up := time.Since(start)
	master := h.master()
	if master == "" {
		fmt.Fprintln(os.Stderr, suiteName+": the controller names no master after up")
		return 1
	}
	// testenv reads these at first use: the collector, producers and
	// consumers find the replica set through the HA bed's name server.
	for k, v := range map[string]string{"RMQTX_NAMESRV": h.namesrv, "RMQTX_BROKER": h.addr[master]} {
		if err := os.Setenv(k, v); err != nil {
			fmt.Fprintln(os.Stderr, suiteName+":", err)
			return 1
		}
	}
	s.ha = h
	s.Report.servicesUp = up
	code := m.Run()
	s.Report.exitCode = code
	sum := s.Report.String()
	fmt.Print(sum)
	if *s.summaryFile != "" && sum != "" {
		if err := os.WriteFile(*s.summaryFile, []byte(sum), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, suiteName+": summary file:", err)
		}
	}
	if !*s.keep {
		if out, err := h.Run("down", "namesrv", "n0", "n1"); err != nil {
			fmt.Fprintf(os.Stderr, "%s: stopping the HA bed: %v\n%s\n", suiteName, err, out)
		}
		if removeDir {
			_ = os.RemoveAll(h.runDir)
		}
	}
	fmt.Printf("%s: total %s (HA bed up in %s)\n", suiteName, time.Since(start).Round(time.Second), up.Round(time.Second))
	return code
}

// mustService runs one services.sh command and fails t on an error.
func (s *Suite) mustService(t testing.TB, args ...string) string {
	t.Helper()
	require.NotNil(t, s.ha, "this test needs the HA bed (started by TestMain)")
	start := time.Now()
	out, err := s.ha.Run(args...)
	require.NoError(t, err, "services.sh %v:\n%s", args, out)
	t.Logf("services.sh %v took %s", args, time.Since(start).Round(100*time.Millisecond))
	return out
}

// keepUp restarts, when t ends, whichever replica is down, so that the next
// test starts with a full replica set.
func (s *Suite) keepUp(t testing.TB) {
	h := s.ha
	t.Cleanup(func() { _, _ = h.Run("up", "n0", "n1") })
}

// moduleRoot is the folder of go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = up
	}
}
