//go:build failpoints

package clustersuite

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txlog"
)

// TestRecoveryOnEitherBroker: halves of a group with no live instance are
// given up by their broker after transactionCheckMax checks and moved to
// that broker's own TRANS_CHECK_MAX_TIME_TOPIC. Discard recovery must
// resolve them on both brokers: the committed one republished (delivered,
// applied once), the one without a row fenced and dropped.
//
// Phase 1 leaves two halves on one broker and starts recovery once that
// broker discarded them. Phase 2 then leaves two halves on the other
// broker while recovery runs. A broker creates its discard topic on its
// first discard, so on a fresh cluster phase 2 shows how long recovery
// takes to cover a broker whose discard topic appeared after it
// subscribed.
func TestRecoveryOnEitherBroker(t *testing.T) {
	t.Parallel()
	eachDB(t, "recovery", func(t *testing.T, b *bed, _ *testbed.Rendezvous) { recoveryOnEitherBroker(t, b) })
}

func recoveryOnEitherBroker(t *testing.T, b *bed) {
	b.StartConsumer(t, "c1")
	ctx := context.Background()

	have := map[string]bool{}
	if addrs, err := remoting.MasterBrokers(ctx, []string{b.S.NameServer}, 5*time.Second, discard.Topic); err == nil {
		for _, a := range addrs {
			have[a] = true
		}
	}
	first, second := suite.BrokerA, suite.BrokerB
	if have[second] && !have[first] {
		first, second = second, first
	}
	late := !have[second]

	expect := map[string]txlog.RecoveryDecision{}
	phase := func(broker string) []string {
		ids := b.crashAll(t, []crashJob{{failpoint.AfterLocalCommit, broker}, {failpoint.InsideLocalTx, broker}})
		expect[ids[0]], expect[ids[1]] = txlog.RecoveryRepublished, txlog.RecoveryFenced
		// No instance of the group is online: nobody answers the checks.
		testenv.Eventually(t, 90*time.Second, "the discards on "+brokerName(broker), func() bool {
			for _, id := range ids {
				on, _ := brokersHolding(ctx, inspect.DiscardTopic, id)
				if !on[brokerName(broker)] {
					return false
				}
			}
			return true
		})
		return ids
	}
	decided := func(ids []string) func() bool {
		return func() bool {
			for _, id := range ids {
				ok := false
				for _, r := range b.Recovered(id) {
					ok = ok || r.Decision != ""
				}
				if !ok {
					return false
				}
			}
			return true
		}
	}

	ids1 := phase(first)
	rec, err := discard.New(discard.Config{
		NameServers: []string{b.S.NameServer}, Group: b.PGroup, Log: b.Store, StartRetry: time.Second,
		OnDecision: b.ProducerConfig("recovery").OnRecovery,
	})
	require.NoError(t, err)
	recStart := time.Now()
	require.NoError(t, rec.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = rec.Shutdown(ctx)
	})
	testenv.Eventually(t, 60*time.Second, "recovery of the discards on "+brokerName(first), decided(ids1))
	t1 := time.Since(recStart)

	ids2 := phase(second)
	discarded := time.Now()
	testenv.Eventually(t, 100*time.Second, "recovery of the discards on "+brokerName(second), decided(ids2))
	t2 := time.Since(discarded)
	b.Sc.Recover = max(t1, t2)

	for id, want := range expect {
		row, err := b.Store.Get(ctx, id)
		require.NoError(t, err)
		a, _ := b.Attempt(id)
		require.Equal(t, want, row.RecoveryDecision, "%s (half on %s)", id, brokerName(a.Broker))
	}
	// The operator's view: the discarded half sits on the second broker.
	in, err := inspect.New(inspect.Config{DB: b.DB, Broker: lookup()})
	require.NoError(t, err)
	v, err := in.Event(ctx, ids2[0])
	require.NoError(t, err)
	require.Empty(t, v.BrokerErrors)
	where := map[string]string{}
	for _, m := range v.Broker {
		if m.Kind != "message" {
			where[m.Kind] = m.Broker
		}
	}
	require.Equal(t, map[string]string{"half": second, "discarded": second}, where, "inspect shows the half and its discard on %s", brokerName(second))

	b.Sc.Note("%s: 2 halves discarded, recovered %s after recovery started; %s: 2 halves discarded while recovery ran%s, recovered %s after the discards were visible",
		brokerName(first), t1.Round(100*time.Millisecond), brokerName(second),
		map[bool]string{true: " (its discard topic did not exist when recovery subscribed)", false: ""}[late], t2.Round(100*time.Millisecond))
	b.Verify(t, 60*time.Second)
}
