package txproducer_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/txproducer"
)

// Ports of the two-broker private stack; each can be overridden. Like
// privateBroker's, they stay below the ephemeral range and clear of the
// other private stacks (a broker also uses port-2 and port+1).
const (
	envTwoMySQLPort   = "RMQTX_TXPRODUCER_2B_MYSQL_PORT"   // default 16407
	envTwoPGPort      = "RMQTX_TXPRODUCER_2B_PG_PORT"      // default 16533
	envTwoNamesrvPort = "RMQTX_TXPRODUCER_2B_NAMESRV_PORT" // default 16976
	envTwoBrokerPort  = "RMQTX_TXPRODUCER_2B_BROKER_PORT"  // default 18211; broker-b on +100
)

// checkSettings are a broker's transaction-check settings, in ms.
type checkSettings struct {
	timeoutMS, intervalMS, checkMax int
}

func (c checkSettings) env() []string {
	return []string{
		"RMQTX_TX_TIMEOUT_MS=" + strconv.Itoa(c.timeoutMS),
		"RMQTX_TX_CHECK_INTERVAL_MS=" + strconv.Itoa(c.intervalMS),
		"RMQTX_TX_CHECK_MAX=" + strconv.Itoa(c.checkMax),
	}
}

// maxFenceAge is the bound the settings put on FenceAge (checkback's doc):
// FenceAge + interval < timeout + (max-1) x interval.
func (c checkSettings) maxFenceAge() time.Duration {
	return time.Duration(c.timeoutMS+(c.checkMax-2)*c.intervalMS) * time.Millisecond
}

// twoBrokers is a private name server with two master brokers whose
// transaction-check settings differ, started by scripts/services.sh: the
// stack with broker-a first (settings a), then broker-b (settings b), each
// from broker.conf with its own settings filled in.
type twoBrokers struct {
	*privateBroker
	AddrB string
}

func startTwoBrokers(t *testing.T, a, b checkSettings) *twoBrokers {
	t.Helper()
	testenv.Integration(t)
	script, err := filepath.Abs(filepath.Join("..", "scripts", "services.sh"))
	require.NoError(t, err)
	runDir, err := os.MkdirTemp("", "rmqtx-txproducer-2b-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(runDir, 0o755)) // services.sh's PostgreSQL user enters it
	brokerPort, err := strconv.Atoi(envOrDefault(envTwoBrokerPort, "18211"))
	require.NoError(t, err)
	pb := &privateBroker{script: script, runDir: runDir, env: append(os.Environ(),
		"RMQTX_RUN_DIR="+runDir,
		"RMQTX_BROKERS=2", // what `down` (and the reaper) stops
		"RMQTX_MYSQL_PORT="+envOrDefault(envTwoMySQLPort, "16407"),
		"RMQTX_PG_PORT="+envOrDefault(envTwoPGPort, "16533"),
		"RMQTX_NAMESRV_PORT="+envOrDefault(envTwoNamesrvPort, "16976"),
		"RMQTX_BROKER_PORT="+strconv.Itoa(brokerPort),
		"RMQTX_BROKER_B_PORT="+strconv.Itoa(brokerPort+100),
	)}
	pb.stopAtEnd(t)
	// with runs services.sh with extra settings (a later entry of an
	// environment wins).
	with := func(extra []string, args ...string) {
		t.Helper()
		c := *pb
		c.env = append(append([]string{}, pb.env...), extra...)
		if out, err := c.run(args...); err != nil {
			logs, _ := pb.run("logs")
			t.Fatalf("services.sh %v: %v\n%s\n%s", args, err, out, logs)
		}
	}
	start := time.Now()
	with(append(a.env(), "RMQTX_BROKERS=1"), "up", "namesrv", "broker") // the name server and broker-a
	with(b.env(), "up", "broker-b")                                     // broker-b joins the name server's cluster
	t.Logf("private name server and two brokers up in %s", time.Since(start).Round(100*time.Millisecond))
	out, err := pb.run("env")
	require.NoError(t, err, out)
	tb := &twoBrokers{privateBroker: pb}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		switch {
		case !ok:
		case k == "RMQTX_NAMESRV":
			pb.NameServer = v
		case k == "RMQTX_BROKER":
			pb.Addr = v
		case k == "RMQTX_BROKER_B":
			tb.AddrB = v
		}
	}
	require.NotEmpty(t, pb.NameServer)
	require.NotEmpty(t, pb.Addr)
	require.NotEmpty(t, tb.AddrB)
	return tb
}

// FenceAge is checked against every master broker's own settings. Two real
// brokers on one name server, with different transactionTimeOut,
// transactionCheckInterval and transactionCheckMax: a FenceAge that fits
// broker-a only is refused (DisableRecovery) or warned about (recovery on)
// once, naming broker-b and its numbers and not broker-a; one that fits
// neither is refused naming both, or warned about once per broker, each
// warning naming its broker; one that fits both starts silently.
func TestStartChecksFenceAgeAgainstEachBroker(t *testing.T) {
	t.Parallel()
	settingsA := checkSettings{timeoutMS: 3000, intervalMS: 2000, checkMax: 5} // FenceAge < 9 s
	settingsB := checkSettings{timeoutMS: 2000, intervalMS: 1500, checkMax: 3} // FenceAge < 3.5 s
	cluster := startTwoBrokers(t, settingsA, settingsB)
	byBroker := map[string]checkSettings{cluster.Addr: settingsA, cluster.AddrB: settingsB}

	// Precondition: each broker runs its own settings.
	for addr, want := range byBroker {
		pb := *cluster.privateBroker
		pb.Addr = addr
		conf := pb.settings(t)
		require.Equal(t, strconv.Itoa(want.timeoutMS), conf["transactionTimeOut"], addr)
		require.Equal(t, strconv.Itoa(want.intervalMS), conf["transactionCheckInterval"], addr)
		require.Equal(t, strconv.Itoa(want.checkMax), conf["transactionCheckMax"], addr)
	}
	require.Equal(t, 9*time.Second, settingsA.maxFenceAge())
	require.Equal(t, 3500*time.Millisecond, settingsB.maxFenceAge())

	db := testenv.DB(t) // the shared MariaDB: Start does not use it, New needs one
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	config := func(fenceAge time.Duration, disableRecovery bool, l logrus.FieldLogger) txproducer.Config {
		return txproducer.Config{
			NameServers: []string{cluster.NameServer}, Group: testenv.Name(t, "pg"), DB: db,
			FenceAge: fenceAge, DisableRecovery: disableRecovery, RecoveryStartRetry: time.Second, Observe: observe.Observe{Logger: l},
		}
	}
	// requireFor asserts e is the finding for the broker at addr.
	requireFor := func(e *txproducer.BrokerSettingsError, addr string, fenceAge time.Duration) {
		t.Helper()
		want := byBroker[addr]
		require.Equal(t, addr, e.Broker)
		require.Equal(t, fenceAge, e.FenceAge)
		require.Equal(t, time.Duration(want.timeoutMS)*time.Millisecond, e.TransactionTimeOut, addr)
		require.Equal(t, time.Duration(want.intervalMS)*time.Millisecond, e.CheckInterval, addr)
		require.Equal(t, want.checkMax, e.CheckMax, addr)
		require.Equal(t, want.maxFenceAge(), e.MaxFenceAge(), addr)
	}
	// refused starts a producer without recovery and returns its refusal.
	refused := func(fenceAge time.Duration) error {
		t.Helper()
		p, err := txproducer.New(config(fenceAge, true, nil))
		require.NoError(t, err)
		err = p.Start(ctx)
		require.ErrorIs(t, err, txproducer.ErrConfig)
		require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(err))
		require.NoError(t, p.Shutdown(ctx), "a refused Start leaves nothing to stop")
		return err
	}
	// warnings starts a producer with recovery and returns its FenceAge
	// warnings.
	warnings := func(fenceAge time.Duration) []*logrus.Entry {
		t.Helper()
		l, hook := captureLogger()
		startProducer(t, config(fenceAge, false, l))
		var out []*logrus.Entry
		for _, e := range hook.AllEntries() {
			if e.Level <= logrus.WarnLevel && strings.Contains(e.Message, "FenceAge") {
				out = append(out, e)
			}
		}
		return out
	}

	// 5 s fits broker-a only.
	fenceAge := 5 * time.Second
	err := refused(fenceAge)
	var bse *txproducer.BrokerSettingsError
	require.ErrorAs(t, err, &bse)
	requireFor(bse, cluster.AddrB, fenceAge)
	require.Contains(t, err.Error(), cluster.AddrB)
	require.NotContains(t, err.Error(), cluster.Addr, "broker-a's settings fit")
	w := warnings(fenceAge)
	require.Len(t, w, 1, "one warning, for broker-b")
	require.Equal(t, logrus.WarnLevel, w[0].Level)
	require.Equal(t, cluster.AddrB, w[0].Data["broker"])
	require.Contains(t, w[0].Message, "broker "+cluster.AddrB)
	require.Contains(t, w[0].Message, "FenceAge < 3.5s")

	// The default 60 s fits neither: the refusal names both, each with its
	// numbers; with recovery, one warning per broker.
	fenceAge = txproducer.DefaultFenceAge
	err = refused(fenceAge)
	for addr, bound := range map[string]string{cluster.Addr: "FenceAge < 9s", cluster.AddrB: "FenceAge < 3.5s"} {
		require.Contains(t, err.Error(), "broker "+addr, "the refusal names every broker FenceAge does not fit")
		require.Contains(t, err.Error(), bound)
	}
	require.ErrorAs(t, err, &bse)
	requireFor(bse, bse.Broker, fenceAge) // the first, with its own numbers
	w = warnings(fenceAge)
	require.Len(t, w, 2, "one warning per broker")
	seen := map[string]bool{}
	for _, e := range w {
		addr, _ := e.Data["broker"].(string)
		require.Contains(t, byBroker, addr)
		require.False(t, seen[addr], "two warnings for %s", addr)
		seen[addr] = true
		require.Contains(t, e.Message, "broker "+addr)
		require.Contains(t, e.Message, "FenceAge < "+byBroker[addr].maxFenceAge().String())
	}

	// 3 s fits both: Start without recovery succeeds, and nothing warns.
	require.Empty(t, warnings(3*time.Second))
	l, hook := captureLogger()
	startProducer(t, config(3*time.Second, true, l))
	for _, e := range hook.AllEntries() {
		require.NotContains(t, e.Message, "FenceAge", "FenceAge 3s fits both brokers")
	}
}
