package txproducer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// Start reads the real broker's flushDiskType and brokerRole and warns,
// naming the broker, exactly when it acknowledges messages it has neither
// flushed nor copied to a synchronous slave: a power loss of its machine
// can then lose committed events (I1 holds as long as the broker's store
// does). The shared bed's broker decides which case this run sees (its
// broker.conf says ASYNC_FLUSH on an ASYNC_MASTER: one warning);
// TestDurabilityWarning covers the others. Both databases: the database is
// only Start's ping here, and costs a few seconds.
func TestStartWarnsAboutDurability(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conf, err := remoting.BrokerConfig(ctx, b.s.Broker, 5*time.Second)
		require.NoError(t, err)
		flush, role := conf["flushDiskType"], conf["brokerRole"]
		require.NotEmpty(t, flush, "the broker reports flushDiskType")
		durable := flush == "SYNC_FLUSH" || role == "SYNC_MASTER" || conf["enableDLegerCommitLog"] == "true"

		l, hook := captureLogger()
		cfg := b.config()
		cfg.Logger = l
		p := startProducer(t, cfg)
		var w []*logrus.Entry
		for _, e := range hook.AllEntries() {
			if e.Level <= logrus.WarnLevel && strings.Contains(e.Message, "flushDiskType") {
				w = append(w, e)
			}
		}
		t.Logf("broker %s: flushDiskType=%s brokerRole=%s: %d durability warning(s)", b.s.Broker, flush, role, len(w))
		if durable {
			require.Empty(t, w, "flushDiskType %s, brokerRole %s: durable, no warning", flush, role)
		} else {
			require.Len(t, w, 1, "flushDiskType %s, brokerRole %s: one warning for the one broker", flush, role)
			require.Equal(t, logrus.WarnLevel, w[0].Level)
			require.Equal(t, b.s.Broker, w[0].Data["broker"])
			require.Contains(t, w[0].Message, "broker "+b.s.Broker+": flushDiskType "+flush+" and brokerRole "+role)
		}
		// A warning, not a refusal: the producer sends.
		b.sendMarker(t, p)
	})
}
