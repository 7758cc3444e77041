package testenv

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// PrivateBrokerOptions configures PrivateBroker.
type PrivateBrokerOptions struct {
	// Name names the run folder (rmqtx-<Name>-*) and prefixes log lines.
	Name string
	// EnvPrefix names the variables that override the ports:
	// <EnvPrefix>_NAMESRV_PORT and <EnvPrefix>_BROKER_PORT. Setting
	// <EnvPrefix>_KEEP_RUN_DIR=1 keeps the run folder of a failed test.
	EnvPrefix string
	// NamesrvPort and BrokerPort are the default ports. The broker uses
	// BrokerPort-2 and BrokerPort+1 too. Each package that starts a private
	// broker needs its own (go test runs packages at the same time); keep
	// them below Linux's ephemeral range (32768 and up).
	NamesrvPort, BrokerPort int
	// AutoCreateTopic is the broker's autoCreateTopicEnable. The zero
	// value, false, is what production clusters usually run: a topic must
	// be created before anything is sent to it.
	AutoCreateTopic bool
	// Env holds further scripts/services.sh settings (KEY=value).
	Env []string
}

// Private is a name server and broker of one test's own, started by
// scripts/services.sh in a run folder of its own; the databases stay the
// shared ones. The broker gets the test bed's broker.conf, with
// autoCreateTopicEnable from the options.
type Private struct {
	NameServer string // host:port of the private name server
	Addr       string // host:port of the private broker (broker-a)

	env    []string
	script string
	runDir string
}

// PrivateBroker starts a private name server and broker and stops them
// (and removes their folder) when t ends, or, through a detached reaper,
// when the test process dies first. It fails t when they do not start.
func PrivateBroker(t testing.TB, o PrivateBrokerOptions) *Private {
	t.Helper()
	Integration(t)
	root, err := moduleRoot()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	runDir, err := os.MkdirTemp("", "rmqtx-"+o.Name+"-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	// services.sh may run a server as its own system user, which must be
	// able to enter the folder.
	if err := os.Chmod(runDir, 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	port := func(suffix string, def int) string {
		if v := os.Getenv(o.EnvPrefix + suffix); v != "" {
			return v
		}
		return strconv.Itoa(def)
	}
	p := &Private{script: filepath.Join(root, "scripts", "services.sh"), runDir: runDir}
	p.env = append(os.Environ(),
		"RMQTX_RUN_DIR="+runDir,
		"RMQTX_BROKERS=1",
		"RMQTX_NAMESRV_PORT="+port("_NAMESRV_PORT", o.NamesrvPort),
		"RMQTX_BROKER_PORT="+port("_BROKER_PORT", o.BrokerPort),
		"RMQTX_BROKER_HEAP=384m",
		"RMQTX_AUTO_CREATE_TOPIC="+strconv.FormatBool(o.AutoCreateTopic),
	)
	p.env = append(p.env, o.Env...)
	p.stopAtEnd(t, os.Getenv(o.EnvPrefix+"_KEEP_RUN_DIR") == "1")
	start := time.Now()
	if out, err := p.Run("up", "namesrv", "broker"); err != nil {
		logs, _ := p.Run("logs", "namesrv", "broker")
		t.Fatalf("testenv: starting the private name server and broker: %v\n%s\n%s", err, out, logs)
	}
	t.Logf("%s: private name server and broker up in %s (autoCreateTopicEnable=%t)", o.Name,
		time.Since(start).Round(100*time.Millisecond), o.AutoCreateTopic)
	out, err := p.Run("env")
	if err != nil {
		t.Fatalf("testenv: services.sh env: %v\n%s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		k, v, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		switch k {
		case "RMQTX_NAMESRV":
			p.NameServer = v
		case "RMQTX_BROKER":
			p.Addr = v
		}
	}
	if p.NameServer == "" || p.Addr == "" {
		t.Fatalf("testenv: services.sh env printed no name server or broker:\n%s", out)
	}
	return p
}

// NameServers is the private name server as a Config's NameServers.
func (p *Private) NameServers() []string { return []string{p.NameServer} }

// Run executes one services.sh command against the private run folder and
// returns its combined output.
func (p *Private) Run(args ...string) (string, error) {
	cmd := exec.Command("bash", append([]string{p.script}, args...)...)
	cmd.Env = p.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// CreateTopic creates topic with queues read and write queues (4 when
// queues <= 0) on the private broker and waits until the private name
// server routes it.
func (p *Private) CreateTopic(t testing.TB, topic string, queues int) {
	t.Helper()
	if queues <= 0 {
		queues = 4
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := remoting.CreateTopic(ctx, p.Addr, 5*time.Second, topic, queues); err != nil {
		t.Fatalf("testenv: create topic %s on %s: %v", topic, p.Addr, err)
	}
	Eventually(t, 30*time.Second, "route of "+topic+" on the private name server", func() bool {
		r, err := remoting.TopicRoute(ctx, p.NameServers(), 5*time.Second, topic)
		return err == nil && len(r) == 1 && r[0].WriteQueues >= queues
	})
}

// stopAtEnd stops the private services (and removes their folder unless
// keep and t failed) when t ends; a detached reaper does it if the test
// process dies first. The reaper's output goes nowhere, so `go test` does
// not wait for it.
func (p *Private) stopAtEnd(t testing.TB, keep bool) {
	t.Helper()
	reap := `while kill -0 "$WATCH" 2>/dev/null; do sleep 2; done; bash "$SCRIPT" down >/dev/null 2>&1`
	if !keep {
		reap += `; rm -rf "$RMQTX_RUN_DIR"`
	}
	reaper := exec.Command("setsid", "bash", "-c", reap)
	reaper.Env = append(append([]string{}, p.env...), "WATCH="+strconv.Itoa(os.Getpid()), "SCRIPT="+p.script)
	if err := reaper.Start(); err != nil {
		t.Fatalf("testenv: reaper: %v", err)
	}
	_ = reaper.Process.Release()
	t.Cleanup(func() {
		if out, err := p.Run("down"); err != nil {
			t.Logf("testenv: services.sh down: %v\n%s", err, out)
		}
		if keep && t.Failed() {
			t.Logf("testenv: kept the private services' run folder %s", p.runDir)
			return
		}
		_ = os.RemoveAll(p.runDir)
	})
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
