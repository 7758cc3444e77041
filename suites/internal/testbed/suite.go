package testbed

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// SuiteConfig describes one suite and its private services.
type SuiteConfig struct {
	// Name is the suite's package name ("faultsuite"): it prefixes messages
	// and names the temp folder and the summary file.
	Name string
	// EnvPrefix names the variables that override the private ports:
	// <EnvPrefix>_MYSQL_PORT, _PG_PORT, _NAMESRV_PORT and _BROKER_PORT.
	EnvPrefix string
	// Default ports of the private MariaDB, PostgreSQL (services.sh starts
	// one too), name server and (first) broker.
	MySQLPort, PGPort, NamesrvPort, BrokerPort int
	// Brokers is 1, or 2 for broker-a and broker-b (broker-b listens 100
	// above broker-a).
	Brokers int
	// HA makes the private services the HA bed of services.sh
	// (RMQTX_BROKERS=ha) instead: a name server on NamesrvPort with the
	// controller embedded (2 above), and the controller-mode replicas n0
	// (BrokerPort) and n1 (100 above), both named broker-a, of which the
	// controller makes one master. The databases are then the shared ones
	// testenv already knows (the HA bed starts none): MySQLPort, PGPort and
	// Brokers are ignored, and the suite never stops a database.
	HA bool
	// Title is the summary's heading, read when the summary is printed.
	Title func(*Suite) string
	// QueuesPerBroker is the number of queues of a bed's topic on each
	// broker (default 4).
	QueuesPerBroker int
	// DBConns bounds a bed's connection pool (default 48).
	DBConns int
	// ErrorPause is how long a load worker waits after an error, so that an
	// outage is a series of clear errors rather than a busy loop (default 1 s).
	ErrorPause time.Duration
}

// Suite is one suite's run: its flags, its private services and its summary.
type Suite struct {
	cfg         SuiteConfig
	runDir      *string
	summaryFile *string
	keep        *bool
	private     *Services

	// Report collects the scenarios' figures; TestMain prints it.
	Report *Summary
	// BrokerA and BrokerB are the private brokers' addresses (BrokerB only
	// with Brokers: 2; with HA, the replicas n0 and n1), set before the
	// tests run.
	BrokerA, BrokerB string
	// Namesrv and Controller are the HA bed's name server and controller
	// (HA only).
	Namesrv, Controller string
}

// NewSuite registers the suite's common flags (-run-dir, -summary-file,
// -keep-services); call it from a package-level var, before flag.Parse.
func NewSuite(cfg SuiteConfig) *Suite {
	if cfg.Brokers <= 0 {
		cfg.Brokers = 1
	}
	if cfg.QueuesPerBroker <= 0 {
		cfg.QueuesPerBroker = 4
	}
	if cfg.DBConns <= 0 {
		cfg.DBConns = 48
	}
	if cfg.ErrorPause <= 0 {
		cfg.ErrorPause = time.Second
	}
	s := &Suite{cfg: cfg, Report: &Summary{}}
	if cfg.Title != nil {
		s.Report.Title = func() string { return cfg.Title(s) }
	}
	s.runDir = flag.String("run-dir", "", "run folder of the private services (default: a new temp folder, removed at the end)")
	s.summaryFile = flag.String("summary-file", filepath.Join(os.TempDir(), "rmqtx-"+cfg.Name+"-summary.txt"),
		"also write the summary here (go test hides a passing package's output unless -v)")
	s.keep = flag.Bool("keep-services", false, "leave the private services running at the end (debugging; use with -run-dir to reuse them)")
	return s
}

// Services drives scripts/services.sh against a private run folder.
type Services struct {
	env    []string
	script string
	runDir string
	names  []string // what up, down and logs act on (nil: everything)
}

// RunDir is the private services' run folder.
func (s *Services) RunDir() string { return s.runDir }

// PostgresDir is the private PostgreSQL's folder (data, log): the run
// folder's postgres/, or, when services.sh ran as root and the postgres user
// could not enter the run folder (a 0700 parent), the folder it recorded in
// postgres.dir.
func (s *Services) PostgresDir() string {
	if b, err := os.ReadFile(filepath.Join(s.runDir, "postgres.dir")); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b))
	}
	return filepath.Join(s.runDir, "postgres")
}

// Run executes one services.sh command and returns its combined output.
func (s *Services) Run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{s.script}, args...)...)
	cmd.Env = s.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// exports returns the settings as printed by `services.sh env`.
func (s *Services) exports() (map[string]string, error) {
	out, err := s.Run("env")
	if err != nil {
		return nil, fmt.Errorf("services.sh env: %w: %s", err, out)
	}
	m := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		if ok {
			// The script single-quotes a value the shell would split
			// (RMQTX_PG_DSN's "?" and "&"); the shell drops the quotes.
			if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
				v = v[1 : len(v)-1]
			}
			m[k] = v
		}
	}
	return m, nil
}

// reaper starts a detached shell that stops the private services and removes
// the run folder if this process dies without doing it (a -timeout panic or a
// kill). Its output goes nowhere so `go test` does not wait for it.
func (s *Services) reaper(removeDir bool) error {
	script := `while kill -0 "$WATCH" 2>/dev/null; do sleep 2; done; bash "$SCRIPT" down $NAMES >/dev/null 2>&1`
	if removeDir {
		// PostgreSQL's folder too when it lies outside (see PostgresDir).
		script += `; d=$(cat "$RMQTX_RUN_DIR/postgres.dir" 2>/dev/null); [ -n "$d" ] && rm -rf "$d"; rm -rf "$RMQTX_RUN_DIR"`
	}
	cmd := exec.Command("setsid", "bash", "-c", script)
	cmd.Env = append(append([]string{}, s.env...), "WATCH="+strconv.Itoa(os.Getpid()), "SCRIPT="+s.script, "NAMES="+strings.Join(s.names, " "))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, nil, nil
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// moduleRoot is the folder of go.mod above the working directory (a test
// runs in its package's folder).
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

func envOr(k string, def int) (int, error) {
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

func (s *Suite) newServices() (*Services, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	runDir := *s.runDir
	if runDir == "" {
		runDir, err = os.MkdirTemp("", "rmqtx-"+s.cfg.Name+"-")
		if err != nil {
			return nil, err
		}
		// Run as root, services.sh runs PostgreSQL as the postgres user,
		// which must reach its folder inside (MkdirTemp makes it 0700).
		if err := os.Chmod(runDir, 0o755); err != nil {
			return nil, err
		}
	}
	ports := map[string]int{"MYSQL": s.cfg.MySQLPort, "PG": s.cfg.PGPort, "NAMESRV": s.cfg.NamesrvPort, "BROKER": s.cfg.BrokerPort}
	brokers, kinds := strconv.Itoa(s.cfg.Brokers), []string{"MYSQL", "PG", "NAMESRV", "BROKER"}
	if s.cfg.HA {
		brokers, kinds = "ha", []string{"NAMESRV", "BROKER"}
	}
	// The short check settings FenceAge is made for, whatever services.sh's
	// defaults: a half nobody answers is discarded after about 13 s
	// (recovery tests wait for that).
	env := append(os.Environ(), "RMQTX_RUN_DIR="+runDir, "RMQTX_BROKERS="+brokers,
		"RMQTX_TX_TIMEOUT_MS=3000", "RMQTX_TX_CHECK_INTERVAL_MS=2000", "RMQTX_TX_CHECK_MAX=5")
	for _, k := range kinds {
		p, err := envOr(s.cfg.EnvPrefix+"_"+k+"_PORT", ports[k])
		if err != nil {
			return nil, err
		}
		ports[k] = p
		env = append(env, "RMQTX_"+k+"_PORT="+strconv.Itoa(p))
	}
	if s.cfg.Brokers > 1 || s.cfg.HA {
		env = append(env, "RMQTX_BROKER_B_PORT="+strconv.Itoa(ports["BROKER"]+100))
	}
	if s.cfg.HA {
		env = append(env, "RMQTX_CONTROLLER_PORT="+strconv.Itoa(ports["NAMESRV"]+2))
	}
	return &Services{env: env, script: filepath.Join(root, "scripts", "services.sh"), runDir: runDir, names: s.serviceNames()}, nil
}

// serviceNames are the services.sh services the suite starts and stops:
// nil for all of them (the private bed), or, on the HA bed, the name server
// and the replicas only, so that the shared databases are never touched.
func (s *Suite) serviceNames() []string {
	if s.cfg.HA {
		return []string{"namesrv", "n0", "n1"}
	}
	return nil
}

// Main is the suite's TestMain: it starts the private services, points
// internal/testenv at them, runs the tests, prints and writes the summary,
// and stops the services. A crash child (internal/testenv Child) and a
// -short run only run the tests: the child inherits its parent's settings,
// and every test here skips under -short.
func (s *Suite) Main(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testenv.InChild() || testing.Short() {
		return m.Run()
	}
	name := s.cfg.Name
	start := time.Now()
	svc, err := s.newServices()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	s.private = svc
	removeDir := *s.runDir == ""
	if !*s.keep {
		if err := svc.reaper(removeDir); err != nil {
			fmt.Fprintln(os.Stderr, name+": reaper:", err)
			return 1
		}
	}
	out, err := svc.Run(append([]string{"up"}, svc.names...)...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: starting the private services failed: %v\n%s\n", name, err, out)
		logs, _ := svc.Run(append([]string{"logs"}, svc.names...)...)
		fmt.Fprintln(os.Stderr, logs)
		_, _ = svc.Run(append([]string{"down"}, svc.names...)...)
		return 1
	}
	exp, err := svc.exports()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	if err := s.useServices(exp); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 1
	}
	s.Report.servicesUp = time.Since(start)
	code := m.Run()
	s.Report.exitCode = code
	sum := s.Report.String()
	fmt.Print(sum)
	if *s.summaryFile != "" && sum != "" {
		if err := os.WriteFile(*s.summaryFile, []byte(sum), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, name+": summary file:", err)
		}
	}
	if !*s.keep {
		if out, err := svc.Run(append([]string{"down"}, svc.names...)...); err != nil {
			fmt.Fprintf(os.Stderr, "%s: stopping the private services: %v\n%s\n", name, err, out)
		}
		if removeDir {
			if pg := svc.PostgresDir(); !strings.HasPrefix(pg, svc.runDir+string(filepath.Separator)) {
				_ = os.RemoveAll(pg) // moved out of the run folder (see PostgresDir)
			}
			_ = os.RemoveAll(svc.runDir)
		}
	}
	fmt.Printf("%s: total %s (private services up in %s)\n", name, time.Since(start).Round(time.Second), s.Report.servicesUp.Round(time.Second))
	return code
}

// useServices points testenv at the services services.sh started (exp is
// what `services.sh env` printed) and sets BrokerA, BrokerB and, on the HA
// bed, Namesrv and Controller.
func (s *Suite) useServices(exp map[string]string) error {
	// testenv reads these at first use; the crash children inherit them.
	// RMQTX_PG_DSN is required too: without it testenv would fall back to
	// the shared PostgreSQL, which the restarts here must never touch.
	keys := []string{"RMQTX_MYSQL_ADDR", "RMQTX_MYSQL_USER", "RMQTX_MYSQL_PASSWORD", "RMQTX_PG_DSN", "RMQTX_NAMESRV", "RMQTX_BROKER"}
	if s.cfg.Brokers > 1 {
		keys = append(keys, "RMQTX_BROKER_B")
	}
	if s.cfg.HA {
		// The databases stay testenv's (shared); the collector, producers
		// and consumers find the replica set through the HA name server.
		keys = []string{"RMQTX_NAMESRV", "RMQTX_CONTROLLER", "RMQTX_HA_N0", "RMQTX_HA_N1"}
	}
	for _, k := range keys {
		if exp[k] == "" {
			return fmt.Errorf("services.sh env printed no %s", k)
		}
	}
	if s.cfg.HA {
		s.Namesrv, s.Controller, s.BrokerA, s.BrokerB = exp["RMQTX_NAMESRV"], exp["RMQTX_CONTROLLER"], exp["RMQTX_HA_N0"], exp["RMQTX_HA_N1"]
		master := s.HAMaster()
		if master == "" {
			return errors.New("the controller names no master after up")
		}
		for k, v := range map[string]string{"RMQTX_NAMESRV": s.Namesrv, "RMQTX_BROKER": s.Node(master)} {
			if err := os.Setenv(k, v); err != nil {
				return err
			}
		}
		return nil
	}
	for _, k := range keys {
		if err := os.Setenv(k, exp[k]); err != nil {
			return err
		}
	}
	s.BrokerA, s.BrokerB = exp["RMQTX_BROKER"], exp["RMQTX_BROKER_B"]
	return nil
}

// Node is the address of the HA bed's replica n ("n0" or "n1"), "" for
// another name.
func (s *Suite) Node(n string) string {
	switch n {
	case "n0":
		return s.BrokerA
	case "n1":
		return s.BrokerB
	}
	return ""
}

// HAState runs the controller probe services.sh built for the HA bed
// (internal/tools/hastate) with args after the bed's own (controller,
// broker name, nodes); its output names the master ("master=n0 ...") and
// each node's role, and it exits non-zero while a node is down or a wait
// (-wait-in-sync) is not met.
func (s *Suite) HAState(args ...string) (string, error) {
	if s.private == nil || !s.cfg.HA {
		return "", errors.New("testbed: HAState needs the suite's HA bed (SuiteConfig.HA, started by Main)")
	}
	base := []string{"-controller", s.Controller, "-broker-name", "broker-a", "-node", "n0=" + s.BrokerA, "-node", "n1=" + s.BrokerB}
	out, err := exec.Command(filepath.Join(s.private.runDir, "bin", "hastate"), append(base, args...)...).CombinedOutput()
	return string(out), err
}

// HAMaster returns the replica the controller made master ("n0" or "n1"),
// or "" when it names none (or cannot be asked) within 5 s.
func (s *Suite) HAMaster() string {
	out, err := s.HAState("-master-only", "-timeout", "5s")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(out)
}

// Private returns the suite's private services, failing t outside a run
// started by Main (the tests that stop a service need them).
func (s *Suite) Private(t testing.TB) *Services {
	t.Helper()
	require.NotNil(t, s.private, "this test needs the suite's private services (started by TestMain)")
	return s.private
}

// MustService runs one services.sh command (kill9 or down) and fails t on
// an error.
func (s *Suite) MustService(t testing.TB, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := s.Private(t).Run(args...)
	require.NoError(t, err, "services.sh %v:\n%s", args, out)
	t.Logf("services.sh %v took %s", args, time.Since(start).Round(100*time.Millisecond))
	return out
}

// routedBrokers is the number of broker names a bed's topic is routed on.
func (s *Suite) routedBrokers() int {
	if s.cfg.HA {
		return 1 // n0 and n1 are both broker-a
	}
	return s.cfg.Brokers
}

// MustComeBack restarts service and fails the test with a failure of its
// own kind when it is not usable again within the script's bound
// (RMQTX_WAIT_SECONDS, 180 s): a restart that does not come back is an
// environment fault to fix (store size, heap, readiness check), never a
// finding about the invariants, and it is never retried.
func (s *Suite) MustComeBack(t testing.TB, service string) {
	t.Helper()
	start := time.Now()
	out, err := s.Private(t).Run("up", service)
	if err != nil {
		s.Report.restartFailed(service, time.Since(start))
		t.Fatalf("RESTART FAILED: %s did not come back within %s of its restart (services.sh up %s: %v):\n%s",
			service, time.Since(start).Round(time.Second), service, err, out)
	}
	t.Logf("services.sh up %s took %s", service, time.Since(start).Round(100*time.Millisecond))
}

// KeepUp makes sure, when t ends, that the services run again for the
// next tests, whatever happened.
func (s *Suite) KeepUp(t testing.TB, services ...string) {
	svc := s.Private(t)
	t.Cleanup(func() { _, _ = svc.Run(append([]string{"up"}, services...)...) })
}

// StopPostgresImmediate stops the private PostgreSQL the way `pg_ctl stop
// -m immediate` does: SIGQUIT to the postmaster (its pid from the data
// folder's postmaster.pid), which ends every backend at once, without a
// checkpoint, so the next start replays the WAL as after a crash. It fails
// t unless the postmaster is gone (exited and reaped) within 60 s.
// MustComeBack(t, "postgres") starts it again. It returns the size of the
// server's log at the stop, for PostgresLogSince.
func (s *Suite) StopPostgresImmediate(t testing.TB) int64 {
	t.Helper()
	start := time.Now()
	var logAt int64
	if fi, err := os.Stat(s.postgresLog(t)); err == nil {
		logAt = fi.Size()
	}
	raw, err := os.ReadFile(filepath.Join(s.Private(t).PostgresDir(), "data", "postmaster.pid"))
	require.NoError(t, err, "the private PostgreSQL's postmaster.pid")
	first, _, _ := strings.Cut(string(raw), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	require.NoError(t, err, "postmaster.pid: %q", first)
	require.Positive(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGQUIT), "SIGQUIT to the postmaster %d", pid)
	deadline := time.Now().Add(60 * time.Second)
	// Gone means reaped, as services.sh sees it (kill -0): it would take a
	// zombie postmaster for a running one and not start a new one.
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the PostgreSQL postmaster %d still runs 60 s after its SIGQUIT", pid)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("PostgreSQL stopped (immediate, postmaster %d) in %s", pid, time.Since(start).Round(100*time.Millisecond))
	return logAt
}

func (s *Suite) postgresLog(t testing.TB) string {
	return filepath.Join(s.Private(t).PostgresDir(), "postgres.log")
}

// PostgresLogSince returns the private PostgreSQL's server log from byte
// offset off (StopPostgresImmediate's result): what the server said about
// its restart, such as its crash recovery.
func (s *Suite) PostgresLogSince(t testing.TB, off int64) string {
	t.Helper()
	f, err := os.Open(s.postgresLog(t))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Seek(off, io.SeekStart)
	require.NoError(t, err)
	b, err := io.ReadAll(f)
	require.NoError(t, err)
	return string(b)
}

// BrokerName names the private broker at addr as services.sh does (on the
// HA bed: the replica, n0 or n1).
func (s *Suite) BrokerName(addr string) string {
	switch {
	case addr == "":
		return ""
	case s.cfg.HA && addr == s.BrokerA:
		return "n0"
	case s.cfg.HA && addr == s.BrokerB:
		return "n1"
	case addr == s.BrokerA:
		return "broker-a"
	case addr == s.BrokerB:
		return "broker-b"
	}
	return addr
}
