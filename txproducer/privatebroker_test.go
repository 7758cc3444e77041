package txproducer_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// Ports of the private services; each can be overridden. The broker uses
// port-2 and port+1 too. All stay below Linux's ephemeral port range (32768
// and up), where an outgoing connection can hold a port the broker then
// cannot bind; faultsuite and clustersuite use other ports.
const (
	envPrivateMySQLPort   = "RMQTX_TXPRODUCER_MYSQL_PORT"   // default 16307
	envPrivatePGPort      = "RMQTX_TXPRODUCER_PG_PORT"      // default 16433
	envPrivateNamesrvPort = "RMQTX_TXPRODUCER_NAMESRV_PORT" // default 16876
	envPrivateBrokerPort  = "RMQTX_TXPRODUCER_BROKER_PORT"  // default 17911
	// envPrivateKeep set to 1 keeps the run folder (logs, stores) of a test
	// that failed; the services are stopped all the same.
	envPrivateKeep = "RMQTX_TXPRODUCER_KEEP_RUN_DIR"
)

// privateSendQueueWait is the private broker's waitTimeMillsInSendQueue:
// longer than any freeze of a test here.
const privateSendQueueWait = 30 * time.Second

// privateBroker is a name server and broker of one test's own, started by
// scripts/services.sh in a run folder of its own, so that the test can
// freeze, kill and restart the broker without touching the shared one
// (only the name server and broker start; the tests keep using the shared
// databases). The broker gets the test bed's broker.conf, as the shared one
// does.
type privateBroker struct {
	env        []string
	script     string
	runDir     string
	NameServer string
	Addr       string
}

func envOrDefault(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// startPrivateBroker starts the private services and stops them (and
// removes their folder) when the test ends, or, through a detached reaper,
// when the test process dies first.
func startPrivateBroker(t *testing.T) *privateBroker {
	t.Helper()
	testenv.Integration(t)
	script, err := filepath.Abs(filepath.Join("..", "scripts", "services.sh"))
	require.NoError(t, err)
	runDir, err := os.MkdirTemp("", "rmqtx-txproducer-")
	require.NoError(t, err)
	// services.sh runs some servers as their own system user (PostgreSQL
	// refuses root), which must be able to enter the folder.
	require.NoError(t, os.Chmod(runDir, 0o755))
	b := &privateBroker{script: script, runDir: runDir, env: append(os.Environ(),
		"RMQTX_RUN_DIR="+runDir,
		"RMQTX_BROKERS=1",
		"RMQTX_MYSQL_PORT="+envOrDefault(envPrivateMySQLPort, "16307"),
		"RMQTX_PG_PORT="+envOrDefault(envPrivatePGPort, "16433"),
		"RMQTX_NAMESRV_PORT="+envOrDefault(envPrivateNamesrvPort, "16876"),
		"RMQTX_BROKER_PORT="+envOrDefault(envPrivateBrokerPort, "17911"),
		// Fast discards (about 13 s) for the tests that wait for them; the
		// tests' FenceAge fits.
		"RMQTX_TX_CHECK_MAX=5",
		// A send that reaches the broker around a freeze waits in its queue
		// for the whole freeze; with the test bed's 1000 ms the thawed broker
		// may fail it fast as "broker busy" instead of storing it late (CI
		// saw "[TIMEOUT_CLEAN_QUEUE] ... period in queue: 2000ms" once).
		"RMQTX_SEND_QUEUE_WAIT_MS="+strconv.Itoa(int(privateSendQueueWait/time.Millisecond)),
	)}
	b.stopAtEnd(t)
	start := time.Now()
	if out, err := b.run("up", "namesrv", "broker"); err != nil {
		logs, _ := b.run("logs")
		t.Fatalf("starting the private services: %v\n%s\n%s", err, out, logs)
	}
	t.Logf("private services up in %s", time.Since(start).Round(100*time.Millisecond))
	out, err := b.run("env")
	require.NoError(t, err, out)
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		switch {
		case !ok:
		case k == "RMQTX_NAMESRV":
			b.NameServer = v
		case k == "RMQTX_BROKER":
			b.Addr = v
		}
	}
	require.NotEmpty(t, b.NameServer)
	require.NotEmpty(t, b.Addr)
	return b
}

// stopAtEnd stops the private services (and removes their folder) when
// the test ends, or, through a detached reaper, when the test process dies
// first.
func (b *privateBroker) stopAtEnd(t *testing.T) {
	t.Helper()
	keep := os.Getenv(envPrivateKeep) == "1"
	reap := `while kill -0 "$WATCH" 2>/dev/null; do sleep 2; done; bash "$SCRIPT" down >/dev/null 2>&1`
	if !keep {
		reap += `; rm -rf "$RMQTX_RUN_DIR"`
	}
	reaper := exec.Command("setsid", "bash", "-c", reap)
	reaper.Env = append(b.env, "WATCH="+strconv.Itoa(os.Getpid()), "SCRIPT="+b.script)
	require.NoError(t, reaper.Start())
	require.NoError(t, reaper.Process.Release())
	t.Cleanup(func() {
		b.thaw(t) // a failed test may leave it frozen
		if out, err := b.run("down"); err != nil {
			t.Logf("services.sh down: %v\n%s", err, out)
		}
		if keep && t.Failed() {
			t.Logf("kept the private services' run folder %s", b.runDir)
			return
		}
		_ = os.RemoveAll(b.runDir)
	})
}

// run executes one services.sh command against the private run folder.
func (b *privateBroker) run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{b.script}, args...)...)
	cmd.Env = b.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// pid is the broker's process id as services.sh recorded it (0: none).
func (b *privateBroker) pid() int {
	s, err := os.ReadFile(filepath.Join(b.runDir, "pids", "broker.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(s)))
	return pid
}

// freeze stops the broker process (SIGSTOP): its connections stay open and
// nothing it is sent is read until thaw.
func (b *privateBroker) freeze(t *testing.T) {
	t.Helper()
	pid := b.pid()
	require.Positive(t, pid, "the private broker runs")
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
}

func (b *privateBroker) thaw(t *testing.T) {
	if pid := b.pid(); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// kill9 SIGKILLs the broker and waits until it is gone.
func (b *privateBroker) kill9(t *testing.T) {
	t.Helper()
	out, err := b.run("kill9", "broker")
	require.NoError(t, err, out)
}

// restart starts the broker again and returns when services.sh found it
// usable (registered with the name server, and a send to it stored).
func (b *privateBroker) restart(t *testing.T) time.Time {
	t.Helper()
	start := time.Now()
	out, err := b.run("up", "broker")
	require.NoError(t, err, "services.sh up broker:\n%s", out)
	t.Logf("private broker usable again %s after its restart began", time.Since(start).Round(100*time.Millisecond))
	return time.Now()
}

// createTopic creates topic on the private broker and waits until its name
// server routes it.
func (b *privateBroker) createTopic(t *testing.T, topic string, queues int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, remoting.CreateTopic(ctx, b.Addr, 5*time.Second, topic, queues))
	testenv.Eventually(t, 30*time.Second, "route of "+topic+" on the private name server", func() bool {
		r, err := remoting.TopicRoute(ctx, []string{b.NameServer}, 5*time.Second, topic)
		return err == nil && len(r) == 1 && r[0].WriteQueues >= queues
	})
}

// settings returns the broker's running configuration.
func (b *privateBroker) settings(t *testing.T) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conf, err := remoting.BrokerConfig(ctx, b.Addr, 5*time.Second)
	require.NoError(t, err)
	return conf
}

// testLogger is a logger that writes to t's log (shown with -v or when t
// fails), and drops what arrives after t's cleanups (register it before
// the producer it is given to, so its cleanup runs after the producer's).
func testLogger(t *testing.T) *logrus.Logger {
	w := &tWriter{t: t}
	t.Cleanup(func() { w.mu.Lock(); w.done = true; w.mu.Unlock() })
	l := logrus.New()
	l.SetOutput(w)
	l.SetLevel(logrus.InfoLevel)
	return l
}

type tWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *tWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}
