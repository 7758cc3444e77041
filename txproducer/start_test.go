package txproducer_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txproducer"
)

func captureLogger() (*logrus.Logger, *test.Hook) {
	l, hook := test.NewNullLogger()
	l.SetLevel(logrus.TraceLevel)
	return l, hook
}

// Start reads the real broker's check settings (transactionTimeOut 3 s,
// transactionCheckInterval 2 s, transactionCheckMax 32 on the test bed:
// FenceAge must stay below 3 + 31x2 - 2 = 63 s). The default 60 s fits
// silently, as the tests' 4 s does (issue 31: a default Start against the
// project's own broker warned). 2 min does not fit: without recovery Start
// refuses it with a typed config error, with recovery it starts and warns.
func TestStartChecksFenceAgeAgainstBroker(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const tooOld = 2 * time.Minute
	cfg := b.config()
	cfg.FenceAge = tooOld
	p, err := txproducer.New(cfg)
	require.NoError(t, err)
	err = p.Start(ctx)
	require.ErrorIs(t, err, txproducer.ErrConfig)
	var bse *txproducer.BrokerSettingsError
	require.ErrorAs(t, err, &bse)
	require.Equal(t, b.s.Broker, bse.Broker)
	require.Equal(t, tooOld, bse.FenceAge)
	require.Equal(t, 3*time.Second, bse.TransactionTimeOut)
	require.Equal(t, 2*time.Second, bse.CheckInterval)
	require.Equal(t, 32, bse.CheckMax)
	require.Equal(t, 63*time.Second, bse.MaxFenceAge())
	require.Contains(t, err.Error(), "FenceAge 2m0s")
	require.NoError(t, p.Shutdown(ctx), "a refused Start leaves nothing to stop")

	warned := func(hook *test.Hook) []*logrus.Entry {
		var out []*logrus.Entry
		for _, e := range hook.AllEntries() {
			if e.Level <= logrus.WarnLevel && strings.Contains(e.Message, "FenceAge") {
				out = append(out, e)
			}
		}
		return out
	}

	l, hook := captureLogger()
	cfg.Logger, cfg.DisableRecovery, cfg.RecoveryStartRetry = l, false, time.Second
	startProducer(t, cfg)
	w := warned(hook)
	require.Len(t, w, 1, "one warning for the one broker")
	require.Equal(t, logrus.WarnLevel, w[0].Level)
	require.Equal(t, b.s.Broker, w[0].Data["broker"])
	require.Contains(t, w[0].Message, "FenceAge 2m0s does not fit")
	require.Contains(t, w[0].Message, "FenceAge < 1m3s")

	for name, age := range map[string]time.Duration{"default": 0, "tests": testFenceAge} {
		l, hook = captureLogger()
		cfg = b.config()
		cfg.Group, cfg.Logger, cfg.FenceAge = testenv.Name(t, "pg"+name), l, age
		cfg.DisableRecovery = true // a FenceAge that did not fit would be refused
		startProducer(t, cfg)
		require.Empty(t, warned(hook), "FenceAge %s (%s) fits the broker", age, name)
	}
}

// A healthy Start logs no error, neither from rmqtx nor from the client:
// the warm-up probe used to be rolled back by the listener, and the client
// logs every such answer at error level. (Not parallel: it routes the
// client's process-wide logger to its own hook while it runs, so its two
// databases run one after the other.) On both databases: Start checks the
// database before the client starts.
func TestHealthyStartLogsNoError(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		b := setupOn(t, db, 1)
		l, hook := captureLogger()
		rmqlog.Route(l)
		t.Cleanup(func() { rmqlog.Route(nil) })
		cfg := b.config()
		cfg.Logger = l
		cfg.WarmupTopics = []string{b.topic, b.topic + "_second"}
		testenv.CreateTopic(t, cfg.WarmupTopics[1], 1)
		p := startProducer(t, cfg)
		require.NotEmpty(t, hook.AllEntries(), "the client's logger is routed here")
		for _, e := range hook.AllEntries() {
			require.Greater(t, e.Level, logrus.ErrorLevel, "a healthy Start logged at %s: %s %v", e.Level, e.Message, e.Data)
		}

		// A committed Send logs no error either, and is consumed.
		b.sendMarker(t, p)
		for _, e := range hook.AllEntries() {
			require.Greater(t, e.Level, logrus.ErrorLevel, "a committed Send logged at %s: %s %v", e.Level, e.Message, e.Data)
		}
	})
}

// Start reads the real broker's transactionTimeOut and
// transactionOpBatchInterval and warns, naming the broker and both numbers,
// exactly when the broker checks halves no later than it writes their op
// records (it then re-stores committed events). The shared bed's broker
// decides which case this run sees; the private broker of TestBrokerFaults
// runs the bed's broker.conf, which must not warn.
func TestStartWarnsAboutOpBatching(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conf, err := remoting.BrokerConfig(ctx, b.s.Broker, 5*time.Second)
	require.NoError(t, err)
	timeout, err := strconv.Atoi(conf["transactionTimeOut"])
	require.NoError(t, err)
	batch := 3000 // the broker's default when the key is absent
	if v, ok := conf["transactionOpBatchInterval"]; ok {
		batch, err = strconv.Atoi(v)
		require.NoError(t, err)
	}

	l, hook := captureLogger()
	cfg := b.config()
	cfg.Logger = l
	startProducer(t, cfg)
	var w []*logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.WarnLevel && strings.Contains(e.Message, "transactionOpBatchInterval") {
			w = append(w, e)
		}
	}
	if timeout > batch {
		require.Empty(t, w, "transactionTimeOut %d > transactionOpBatchInterval %d: no warning", timeout, batch)
		return
	}
	require.Len(t, w, 1, "transactionTimeOut %d <= transactionOpBatchInterval %d: one warning for the one broker", timeout, batch)
	require.Equal(t, logrus.WarnLevel, w[0].Level)
	require.Equal(t, b.s.Broker, w[0].Data["broker"])
	require.Contains(t, w[0].Message, b.s.Broker)
	require.Contains(t, w[0].Message, fmt.Sprintf("transactionTimeOut %d ms <= transactionOpBatchInterval %d ms", timeout, batch))
}
