package discard_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// These tests make the real broker discard half messages (see discardBed)
// and check what recovery does with them, against the real MariaDB.

// Recovery's database is unreachable at its first attempt and for more
// than the client's 16 reconsumes, then comes back: the committed event is
// delivered exactly once, on its real topic, and the gauge of undecided
// halves goes up and back to 0. A failed republish at the first attempt
// ends the same way. (Before the fix, the first failure sent the message
// through the broker's retry topic, which rewrote REAL_TOPIC: the event was
// republished into %RETRY%<group>-recovery and lost; after 16 failures it
// went to %DLQ%.)
func TestRecoveryDatabaseOutage(t *testing.T) {
	t.Parallel()
	t.Run("database down for more than 16 attempts", func(t *testing.T) {
		t.Parallel()
		eachDB(t, func(t *testing.T, b *discardBed) {
			proxy := testenv.NewCutProxy(t, testenv.ServerAddr(t, b.db))
			proxy.Cut()
			viaProxy, err := txlog.New(testenv.PoolVia(t, b.db, proxy.Addr()), txlog.DefaultPrefix)
			require.NoError(t, err)
			_, res, m := b.startRecovery(t, viaProxy, nil)
			id := b.sendHalf(t, commitRow)

			all := res.wait(t, discardWait, "more than 16 failed attempts", func(all []discard.Result) bool { return failures(all, id) > 16 })
			require.Equal(t, 1, all[0].Attempt)
			require.Error(t, all[0].Err, "the first attempt failed")
			require.Equal(t, 1.0, undecided(m, b.group), "one discarded half is undecided during the outage")
			require.Empty(t, b.row(t, id).RecoveryDecision)
			require.Zero(t, b.coll.Snapshot().Counts[id])

			proxy.Restore()
			back := time.Now()
			all = res.wait(t, 60*time.Second, "republished", decided(id, txlog.RecoveryRepublished))
			lag := time.Since(back)
			testenv.Eventually(t, 10*time.Second, "gauge back to 0", func() bool { return undecided(m, b.group) == 0 })
			require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "committed event lost")
			snap := b.settle(t)
			require.Equal(t, 1, snap.Counts[id], "delivered exactly once on the real topic")
			got := b.coll.Message(id)
			require.Equal(t, b.topic, got.Topic)
			require.Equal(t, b.payload(id), got.Body)
			require.Equal(t, "placed", got.GetTags())
			row := b.row(t, id)
			require.Equal(t, txlog.RecoveryRepublished, row.RecoveryDecision)
			require.Equal(t, b.topic, all[len(all)-1].Topic)
			t.Logf("outage: %d failed attempts, republished %s after the database came back; deliveries=%d",
				failures(all, id), lag.Round(time.Millisecond), snap.Counts[id])
		})
	})
	t.Run("republish fails at the first attempt", func(t *testing.T) {
		t.Parallel()
		eachDB(t, func(t *testing.T, b *discardBed) {
			pub := &failFirstPublisher{p: testenv.Producer(t)}
			_, res, m := b.startRecovery(t, b.store, func(c *discard.Config) { c.Publisher = pub })
			id := b.sendHalf(t, commitRow)

			all := res.wait(t, discardWait, "republished", decided(id, txlog.RecoveryRepublished))
			require.Error(t, all[0].Err, "the first republish failed")
			require.ErrorContains(t, all[0].Err, "injected")
			require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "committed event lost")
			snap := b.settle(t)
			require.Equal(t, 1, snap.Counts[id], "delivered exactly once on the real topic")
			require.Equal(t, b.topic, b.coll.Message(id).Topic)
			testenv.Eventually(t, 10*time.Second, "gauge back to 0", func() bool { return undecided(m, b.group) == 0 })
		})
	})
}

type failFirstPublisher struct {
	p discard.Publisher
	n atomic.Int32
}

func (f *failFirstPublisher) SendSync(ctx context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	if f.n.Add(1) == 1 {
		return nil, errors.New("injected: broker unreachable")
	}
	return f.p.SendSync(ctx, msgs...)
}

// A discarded half that already went once through the recovery group's
// retry topic (the broker then rewrites REAL_TOPIC to %RETRY%...) is
// recovered from the txlog row: the committed one is delivered on its real
// topic exactly once, and the fence row of the one without a row does not
// record the retry topic.
func TestRecoveryOfRedeliveredHalves(t *testing.T) {
	t.Parallel()
	eachDB(t, testRecoveryOfRedeliveredHalves)
}

func testRecoveryOfRedeliveredHalves(t *testing.T, b *discardBed) {
	committed := b.sendHalf(t, commitRow)
	missing := b.sendHalf(t, noRow)
	recoveryGroup := b.group + "-recovery"
	retryTopic := "%RETRY%" + recoveryGroup

	// An earlier instance of the recovery group that answered RetryLater
	// once for each of them: the broker re-stores them through its delay
	// queue into the retry topic.
	// On a fresh broker DiscardTopic exists only once the broker has
	// discarded a first half (it creates the topic then), and a push
	// consumer cannot start on a topic without a route.
	testenv.Eventually(t, discardWait, "the broker created "+discard.Topic, func() bool {
		_, err := remoting.MasterBrokers(context.Background(), []string{b.s.NameServer}, 0, discard.Topic)
		return err == nil
	})
	var mu sync.Mutex
	bounced := map[string]bool{}
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithGroupName(recoveryGroup),
		consumer.WithInstance(testenv.Name(t, "bounce")),
		consumer.WithNsResolver(b.s.NameServerResolver()),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		consumer.WithConsumeMessageBatchMaxSize(1),
	)
	require.NoError(t, err)
	require.NoError(t, pc.Subscribe(discard.Topic, consumer.MessageSelector{}, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		for _, m := range msgs {
			if m.GetProperty(primitive.PropertyProducerGroup) == b.group {
				mu.Lock()
				bounced[m.GetProperty(wire.PropEventID)] = true
				mu.Unlock()
				if cc, ok := primitive.GetConcurrentlyCtx(ctx); ok {
					cc.DelayLevelWhenNextConsume = 1
				}
				return consumer.ConsumeRetryLater, nil
			}
		}
		return consumer.ConsumeSuccess, nil
	}))
	require.NoError(t, pc.Start())
	lookup := inspect.RemotingLookup{Brokers: []string{b.s.Broker}}
	inRetryTopic := func(id string) bool {
		ms, err := lookup.QueryByKey(context.Background(), retryTopic, id, 4)
		return err == nil && len(ms) > 0
	}
	testenv.Eventually(t, discardWait, "both halves in the recovery group's retry topic", func() bool {
		return inRetryTopic(committed) && inRetryTopic(missing)
	})
	require.NoError(t, pc.Shutdown())
	mu.Lock()
	require.True(t, bounced[committed] && bounced[missing])
	mu.Unlock()
	ms, err := lookup.QueryByKey(context.Background(), retryTopic, committed, 4)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(ms[0].RealTopic, "%RETRY%"), "precondition: the broker rewrote REAL_TOPIC to %s", ms[0].RealTopic)

	_, res, _ := b.startRecovery(t, b.store, nil)
	all := res.wait(t, 60*time.Second, "both decided", func(all []discard.Result) bool {
		return decided(committed, txlog.RecoveryRepublished)(all) && decided(missing, txlog.RecoveryFenced)(all)
	})
	for _, r := range all {
		require.True(t, r.Redelivered, "recovery saw the travelled copies: %+v", r)
	}
	fence := b.row(t, missing)
	require.Equal(t, txlog.StateRolledBack, fence.State)
	require.Equal(t, txlog.ByRecovery, fence.ResolvedBy)
	require.Empty(t, fence.Topic, "the retry topic is never recorded as the event's topic")

	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[committed] > 0 }), "committed event lost")
	snap := b.settle(t)
	require.Equal(t, 1, snap.Counts[committed], "delivered exactly once on the real topic")
	require.Zero(t, snap.Counts[missing], "ghost event")
	require.Equal(t, b.topic, b.coll.Message(committed).Topic)
	require.Equal(t, b.payload(committed), b.coll.Message(committed).Body)
}

// The decisions that do not publish, on the real broker and MariaDB: a
// discarded half with no txlog row is fenced (a ROLLED_BACK row exists
// afterwards), one with a ROLLED_BACK row is dropped, and a COMMITTED one
// whose payload was not stored is decided NO_PAYLOAD and alerted. Nothing is
// delivered on the real topic.
func TestRecoveryFenceDropNoPayload(t *testing.T) {
	t.Parallel()
	eachDB(t, testRecoveryFenceDropNoPayload)
}

func testRecoveryFenceDropNoPayload(t *testing.T, b *discardBed) {
	retryTopic := "%RETRY%" + b.group + "-recovery"
	_, err := remoting.MasterBrokers(context.Background(), []string{b.s.NameServer}, 0, retryTopic)
	require.ErrorIs(t, err, remoting.ErrTopicNotFound, "precondition: a new group has no retry topic")
	r, res, m := b.startRecovery(t, b.store, nil)
	missing := b.sendHalf(t, noRow)
	rolledBack := b.sendHalf(t, rollbackRow)
	noPayload := b.sendHalf(t, commitRowNoPayload)

	res.wait(t, discardWait, "three decisions", func(all []discard.Result) bool {
		return decided(missing, txlog.RecoveryFenced)(all) && decided(rolledBack, txlog.RecoveryDropped)(all) &&
			decided(noPayload, txlog.RecoveryNoPayload)(all)
	})
	select {
	case <-r.Running():
	default:
		t.Fatal("decisions before the subscription is live")
	}
	// Recovery created its retry topic before subscribing, so a message
	// handed back is redelivered without waiting for a route refresh.
	brokers, err := remoting.MasterBrokers(context.Background(), []string{b.s.NameServer}, 0, retryTopic)
	require.NoError(t, err)
	require.Equal(t, []string{b.s.Broker}, brokers)

	fence := b.row(t, missing)
	require.Equal(t, txlog.StateRolledBack, fence.State)
	require.Equal(t, txlog.ByRecovery, fence.ResolvedBy)
	require.Equal(t, txlog.RecoveryFenced, fence.RecoveryDecision)
	require.Equal(t, b.topic, fence.Topic, "a first delivery's REAL_TOPIC is the broker's own")
	rb := b.row(t, rolledBack)
	require.Equal(t, txlog.ByLocalRollback, rb.ResolvedBy)
	require.Equal(t, txlog.RecoveryDropped, rb.RecoveryDecision)
	np := b.row(t, noPayload)
	require.Equal(t, txlog.StateCommitted, np.State)
	require.Equal(t, txlog.RecoveryNoPayload, np.RecoveryDecision)

	snap := b.settle(t)
	for _, id := range []string{missing, rolledBack, noPayload} {
		require.Zero(t, snap.Counts[id], id)
	}
	for d, want := range map[string]float64{"fenced": 1, "dropped": 1, "no_payload": 1, "republished": 0} {
		require.Equal(t, want, counter(m.DiscardRecoveries.WithLabelValues(b.group, d)), d)
	}
	require.Equal(t, 1.0, counter(m.CheckbackFences.WithLabelValues(b.group)))
	// The gauge drops when the decision's goroutine returns, just after it
	// reports the decision: wait for it (bounded); a stuck gauge fails.
	testenv.Eventually(t, 10*time.Second, "undecided gauge back to 0", func() bool { return undecided(m, b.group) == 0 })
}

// Two Sends race on one event id: the winner commits and its event is on
// the topic; the loser's half, whose END_TRANSACTION (ROLLBACK) is lost and
// whose checks no producer answers, is discarded by the real broker.
// Recovery finds the COMMITTED row, sees that it records another half's
// UNIQ_KEY, and drops the loser (issue 27, item 4): the event stays on the
// topic once, as the winner's message, counted by an independent consumer
// after a marker sent once the decision was made. (Before, the loser was
// republished under its own UNIQ_KEY: a second copy.) The decision is
// recorded on the row, logged and counted, without the payload.
func TestRecoveryDropsLosingHalf(t *testing.T) {
	t.Parallel()
	eachDB(t, testRecoveryDropsLosingHalf)
}

func testRecoveryDropsLosingHalf(t *testing.T, b *discardBed) {
	_, res, m := b.startRecovery(t, b.store, nil)
	id, winner, loser := b.sendRacingHalves(t)
	require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "the winner's commit is on the topic")

	all := res.wait(t, discardWait, "a decision on the losing half", func(all []discard.Result) bool {
		for _, r := range all {
			if r.HalfKey == loser && r.Err == nil && r.Decision != "" {
				return true
			}
		}
		return false
	})
	// The marker goes after the decision, on the topic's one queue: a
	// republish, made before the decision is reported, would be seen first.
	snap := b.settle(t)
	stored := b.coll.Stored()
	require.Equal(t, 1, stored[id], "one copy of the event on the topic (deliveries %d)", snap.Counts[id])
	got := b.coll.Message(id)
	require.Equal(t, winner, got.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex), "the copy is the winner's")
	require.Equal(t, b.payload(id), got.Body)
	require.True(t, decidedHalf(id, loser, txlog.RecoveryDropped)(all), "the losing half is dropped: %+v", all)
	for _, r := range all {
		require.NotEqual(t, txlog.RecoveryRepublished, r.Decision, "nothing was republished: %+v", r)
	}

	row := b.row(t, id)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Equal(t, txlog.RecoveryDropped, row.RecoveryDecision)
	require.Contains(t, row.RecoveryNote, loser)
	require.Contains(t, row.RecoveryNote, winner)
	require.NotContains(t, row.RecoveryNote, string(b.payload(id)))
	require.Equal(t, 1.0, counter(m.DiscardRecoveries.WithLabelValues(b.group, "dropped")))
	require.Zero(t, counter(m.DiscardRecoveries.WithLabelValues(b.group, "republished")))
	testenv.Eventually(t, 10*time.Second, "undecided gauge back to 0", func() bool { return undecided(m, b.group) == 0 })
	b.l.mu.Lock()
	rechecks := b.l.checksOfCommitted
	b.l.mu.Unlock()
	t.Logf("losing half: copies=%d deliveries=%d decisions=%d rechecks_of_the_committed_half=%d", stored[id], snap.Counts[id], len(all), rechecks)
}
