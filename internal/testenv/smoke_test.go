package testenv_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// These smoke tests prove the test bed with the raw client only: a real
// broker that delivers, commits, rolls back and checks back quickly.

func TestSmokeNormalMessage(t *testing.T) {
	t.Parallel()
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 2)
	c := testenv.Collect(t, topic)
	p := testenv.Producer(t)

	id := wire.NewEventID()
	msg := primitive.NewMessage(topic, []byte("hello"))
	msg.WithProperty(wire.PropEventID, id)
	res, err := p.SendSync(context.Background(), msg)
	require.NoError(t, err)
	require.Equal(t, primitive.SendOK, res.Status)

	snap := c.WaitDistinct(t, 1, 60*time.Second)
	require.Equal(t, 1, snap.Counts[id])
	require.Equal(t, "hello", string(c.Message(id).Body))
}

// txListener answers ExecuteLocalTransaction from a per-message plan and
// records every check it receives.
type txListener struct {
	mu     sync.Mutex
	plan   map[string]primitive.LocalTransactionState             // event id -> answer to execute
	checks map[string]int                                         // event id -> checks received
	answer func(id string, n int) primitive.LocalTransactionState // answer to the n-th check
	notify chan struct{}
}

func newTxListener() *txListener {
	return &txListener{plan: map[string]primitive.LocalTransactionState{}, checks: map[string]int{}, notify: make(chan struct{}, 64)}
}

func (l *txListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.plan[m.GetProperty(wire.PropEventID)]
}

func (l *txListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	id := m.GetProperty(wire.PropEventID)
	l.mu.Lock()
	l.checks[id]++
	n := l.checks[id]
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
	if l.answer == nil {
		return primitive.UnkonwnState
	}
	return l.answer(id, n)
}

func (l *txListener) checkCount(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checks[id]
}

func newTxProducer(t *testing.T, s testenv.Settings, l *txListener) rocketmq.TransactionProducer {
	t.Helper()
	group := testenv.Name(t, "txg")
	p, err := rocketmq.NewTransactionProducer(l,
		producer.WithNsResolver(s.NameServerResolver()),
		producer.WithGroupName(group),
		producer.WithInstanceName(group),
		producer.WithRetry(2),
	)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

func txMessage(topic, id string) *primitive.Message {
	m := primitive.NewMessage(topic, []byte("tx-"+id))
	m.WithProperty(wire.PropEventID, id)
	m.WithKeys([]string{id})
	return m
}

func TestSmokeTransactionCommit(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 2)
	c := testenv.Collect(t, topic)
	l := newTxListener()
	p := newTxProducer(t, s, l)

	id := wire.NewEventID()
	l.plan[id] = primitive.CommitMessageState
	res, err := p.SendMessageInTransaction(context.Background(), txMessage(topic, id))
	require.NoError(t, err)
	require.Equal(t, primitive.CommitMessageState, res.State)
	snap := c.WaitDistinct(t, 1, 60*time.Second)
	require.Equal(t, 1, snap.Counts[id])
}

// TestSmokeRollbackAndCheckBack sends one transaction answered ROLLBACK and
// one answered UNKNOWN. The broker must check the UNKNOWN one back within a
// few seconds (proof that the short check settings took effect); it is
// answered COMMIT on its second check. Two checks of the UNKNOWN message are
// two full check cycles: had the rolled-back half still been pending, it
// would have been checked too. The rolled-back message is never delivered
// and never checked.
func TestSmokeRollbackAndCheckBack(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	c := testenv.Collect(t, topic)
	l := newTxListener()
	var firstCheck atomic.Int64
	l.answer = func(_ string, n int) primitive.LocalTransactionState {
		if n == 1 {
			firstCheck.Store(time.Now().UnixNano())
			return primitive.UnkonwnState
		}
		return primitive.CommitMessageState
	}
	p := newTxProducer(t, s, l)

	rolledBack, unknown := wire.NewEventID(), wire.NewEventID()
	l.plan[rolledBack] = primitive.RollbackMessageState
	l.plan[unknown] = primitive.UnkonwnState
	res, err := p.SendMessageInTransaction(context.Background(), txMessage(topic, rolledBack))
	require.NoError(t, err)
	require.Equal(t, primitive.RollbackMessageState, res.State)
	sent := time.Now()
	res, err = p.SendMessageInTransaction(context.Background(), txMessage(topic, unknown))
	require.NoError(t, err)
	require.Equal(t, primitive.UnkonwnState, res.State)

	// The broker's defaults (6 s timeout, 30 s interval) would need far
	// longer than this; the test bed's settings answer within seconds.
	snap := c.WaitDistinct(t, 1, 45*time.Second)
	require.Equal(t, 1, snap.Counts[unknown], "the checked-back transaction is delivered once")
	require.GreaterOrEqual(t, l.checkCount(unknown), 2)
	firstAfter := time.Duration(firstCheck.Load() - sent.UnixNano())
	t.Logf("first check-back %s after the half message", firstAfter.Round(time.Millisecond))

	require.Zero(t, snap.Counts[rolledBack], "a rolled-back transaction must never be delivered")
	require.Zero(t, l.checkCount(rolledBack), "a rolled-back transaction is never checked")
}
