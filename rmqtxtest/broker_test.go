package rmqtxtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// The client's logger is process-global and rmqtx components replace it
// once (rmqlog.Install) when they start: doing it before any client runs
// keeps that swap from racing with the raw clients these tests start.
func init() { rmqlog.Install(nil) }

var nameSeq atomic.Int64

// uniq returns a name unique in this test binary: the client keeps one
// instance per client id process-wide, so each test uses its own names.
func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, nameSeq.Add(1)) }

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func newProducer(t *testing.T, b *Broker, opts ...producer.Option) rocketmq.Producer {
	t.Helper()
	opts = append([]producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver(b.NameServers())),
		producer.WithGroupName(uniq("pg")), producer.WithInstanceName(uniq("pi")),
		producer.WithSendMsgTimeout(3 * time.Second),
	}, opts...)
	p, err := rocketmq.NewProducer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// listener is a transaction listener whose answers a test sets.
type listener struct {
	exec   atomic.Int32 // primitive.LocalTransactionState
	check  atomic.Int32
	checks atomic.Int32
}

func (l *listener) ExecuteLocalTransaction(*primitive.Message) primitive.LocalTransactionState {
	return primitive.LocalTransactionState(l.exec.Load())
}

func (l *listener) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	l.checks.Add(1)
	return primitive.LocalTransactionState(l.check.Load())
}

func newTxProducer(t *testing.T, b *Broker, l *listener) (rocketmq.TransactionProducer, string) {
	t.Helper()
	group := uniq("txg")
	p, err := rocketmq.NewTransactionProducer(l,
		producer.WithNsResolver(primitive.NewPassthroughResolver(b.NameServers())),
		producer.WithGroupName(group), producer.WithInstanceName(uniq("txi")),
		producer.WithSendMsgTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p, group
}

// received collects what a push consumer's listener saw.
type received struct {
	mu   sync.Mutex
	msgs []*primitive.MessageExt
	ch   chan struct{}
}

func (r *received) add(ms ...*primitive.MessageExt) {
	r.mu.Lock()
	r.msgs = append(r.msgs, ms...)
	r.mu.Unlock()
	select {
	case r.ch <- struct{}{}:
	default:
	}
}

// wait returns once n messages were received, or fails the test.
func (r *received) wait(t *testing.T, ctx context.Context, n int) []*primitive.MessageExt {
	t.Helper()
	for {
		r.mu.Lock()
		out := append([]*primitive.MessageExt(nil), r.msgs...)
		r.mu.Unlock()
		if len(out) >= n {
			return out
		}
		select {
		case <-r.ch:
		case <-ctx.Done():
			t.Fatalf("received %d of %d messages: %v", len(out), n, ctx.Err())
		}
	}
}

// newPushConsumer subscribes a push consumer of a new group to topic; fn
// decides each delivery (nil: success).
func newPushConsumer(t *testing.T, b *Broker, topic string, fn func(*primitive.MessageExt) consumer.ConsumeResult, opts ...consumer.Option) (*received, string) {
	t.Helper()
	group := uniq("cg")
	rec := &received{ch: make(chan struct{}, 1)}
	opts = append([]consumer.Option{
		consumer.WithNsResolver(primitive.NewPassthroughResolver(b.NameServers())),
		consumer.WithGroupName(group), consumer.WithInstance(uniq("ci")),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	}, opts...)
	c, err := rocketmq.NewPushConsumer(opts...)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, ms ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		res := consumer.ConsumeSuccess
		for _, m := range ms {
			if fn != nil {
				res = fn(m)
			}
		}
		rec.add(ms...)
		return res, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Shutdown() })
	return rec, group
}

func TestRawClientSendAndReceive(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	p := newProducer(t, b)
	res, err := p.SendSync(ctx, primitive.NewMessage("orders", []byte("hello")).WithTag("created").WithKeys([]string{"k1"}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != primitive.SendOK || res.OffsetMsgID == "" || res.MsgID == "" {
		t.Fatalf("send result %+v", res)
	}
	if id, err := primitive.UnmarshalMsgID([]byte(res.OffsetMsgID)); err != nil || fmt.Sprintf("%s:%d", id.Addr, id.Port) != b.BrokerAddr() {
		t.Fatalf("offset msg id %s: %+v %v", res.OffsetMsgID, id, err)
	}
	msgs := b.Messages("orders")
	if len(msgs) != 1 || string(msgs[0].Body) != "hello" || msgs[0].Tags != "created" || msgs[0].Keys[0] != "k1" || msgs[0].MsgID != res.MsgID {
		t.Fatalf("stored %+v", msgs)
	}
	rec, _ := newPushConsumer(t, b, "orders", nil)
	got := rec.wait(t, ctx, 1)
	if string(got[0].Body) != "hello" || got[0].MsgId != res.MsgID || got[0].OffsetMsgId != res.OffsetMsgID || got[0].GetTags() != "created" {
		t.Fatalf("received %v", got[0])
	}
	// A message sent while the consumer long-polls arrives at once.
	if _, err := p.SendSync(ctx, primitive.NewMessage("orders", []byte("second"))); err != nil {
		t.Fatal(err)
	}
	got = rec.wait(t, ctx, 2)
	if string(got[1].Body) != "second" {
		t.Fatalf("second: %v", got[1])
	}
}

func TestTransactionCommitRollbackAndCheck(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	l := &listener{}
	p, group := newTxProducer(t, b, l)

	l.exec.Store(int32(primitive.CommitMessageState))
	committed, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("tx", []byte("commit")))
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := b.WaitMessages(ctx, "tx", 1)
	if err != nil {
		t.Fatal(err)
	}
	if msgs[0].MsgID != committed.MsgID || string(msgs[0].Body) != "commit" || msgs[0].Properties["TRAN_MSG"] != "" || msgs[0].Properties["REAL_TOPIC"] != "" || msgs[0].Properties["PGROUP"] != group {
		t.Fatalf("committed message %+v", msgs[0])
	}

	l.exec.Store(int32(primitive.RollbackMessageState))
	rolled, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("tx", []byte("rollback")))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, b, func() bool { return len(b.RolledBack()) == 1 })
	if rb := b.RolledBack(); rb[0].MsgID != rolled.MsgID || rb[0].Topic != "tx" || rb[0].Group != group {
		t.Fatalf("rolled back %+v", rb[0])
	}

	l.exec.Store(int32(primitive.UnkonwnState))
	unknown, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("tx", []byte("unknown")))
	if err != nil {
		t.Fatal(err)
	}
	pending := b.Pending()
	if len(pending) != 1 || pending[0].MsgID != unknown.MsgID || pending[0].Properties["REAL_TOPIC"] != "tx" {
		t.Fatalf("pending %+v", pending)
	}
	// Still unknown at the first check; committed at the second.
	l.check.Store(int32(primitive.UnkonwnState))
	if n, err := b.CheckNow(ctx); err != nil || n != 1 {
		t.Fatalf("CheckNow = %d, %v", n, err)
	}
	if p := b.Pending(); len(p) != 1 || p[0].Checks != 1 {
		t.Fatalf("after an unknown check: %+v", p)
	}
	l.check.Store(int32(primitive.CommitMessageState))
	if n, err := b.CheckNow(ctx); err != nil || n != 1 {
		t.Fatalf("CheckNow = %d, %v", n, err)
	}
	if len(b.Pending()) != 0 {
		t.Fatalf("still pending: %+v", b.Pending())
	}
	msgs = b.Messages("tx")
	if len(msgs) != 2 || msgs[0].MsgID == msgs[1].MsgID {
		t.Fatalf("messages %+v", msgs)
	}
	if got := l.checks.Load(); got != 2 {
		t.Fatalf("listener checked %d times, want 2", got)
	}
}

// waitFor waits until cond holds, re-evaluating it on every state change.
func waitFor(t *testing.T, ctx context.Context, b *Broker, cond func() bool) {
	t.Helper()
	for {
		b.lock()
		ch := b.changed
		b.unlock()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("condition not met: %v", ctx.Err())
		}
	}
}

func TestLoseEndTransactionThenCheckNowCommits(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	l := &listener{}
	l.exec.Store(int32(primitive.CommitMessageState))
	l.check.Store(int32(primitive.CommitMessageState))
	p, _ := newTxProducer(t, b, l)
	b.LoseEndTransaction(1)
	res, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("lost", []byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	// The client's one-way COMMIT is dropped: the half stays pending.
	waitFor(t, ctx, b, func() bool {
		b.lock()
		defer b.unlock()
		return b.loseEnd == 0
	})
	if len(b.Pending()) != 1 || len(b.Messages("lost")) != 0 {
		t.Fatalf("pending %d, visible %d", len(b.Pending()), len(b.Messages("lost")))
	}
	if n, err := b.CheckNow(ctx); err != nil || n != 1 {
		t.Fatalf("CheckNow = %d, %v", n, err)
	}
	msgs := b.Messages("lost")
	if len(msgs) != 1 || msgs[0].MsgID != res.MsgID || len(b.Pending()) != 0 {
		t.Fatalf("after the check: visible %+v, pending %d", msgs, len(b.Pending()))
	}
}

func TestAdvanceChecksAfterImmunityAndDiscardsAfterCheckMax(t *testing.T) {
	b := NewBroker(t, Options{CheckImmunity: 10 * time.Second, CheckMax: 2})
	ctx := ctxT(t, 30*time.Second)
	l := &listener{} // UNKNOWN everywhere
	p, _ := newTxProducer(t, b, l)
	start := b.Now()
	if _, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("adv", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Advance(ctx, 9*time.Second); err != nil || n != 0 {
		t.Fatalf("Advance before immunity = %d, %v", n, err)
	}
	for i := 1; i <= 2; i++ {
		if n, err := b.Advance(ctx, time.Second); err != nil || n != 1 {
			t.Fatalf("Advance %d = %d, %v", i, n, err)
		}
		if p := b.Pending(); len(p) != 1 || p[0].Checks != i {
			t.Fatalf("after check %d: %+v", i, p)
		}
	}
	if got := b.Now().Sub(start); got != 11*time.Second {
		t.Fatalf("clock moved %s", got)
	}
	// The third round finds CheckMax checks done: the half is discarded.
	if n, err := b.Advance(ctx, time.Second); err != nil || n != 0 {
		t.Fatalf("Advance after CheckMax = %d, %v", n, err)
	}
	if len(b.Pending()) != 0 {
		t.Fatalf("still pending: %+v", b.Pending())
	}
	d := b.Messages(discardTopic)
	if len(d) != 1 || d[0].Properties["REAL_TOPIC"] != "adv" || d[0].Properties["TRANSACTION_CHECK_TIMES"] != "2" {
		t.Fatalf("discarded %+v", d)
	}
}

func TestDiscardHalvesReachesADiscardTopicConsumer(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	l := &listener{}
	p, group := newTxProducer(t, b, l)
	res, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("disc", []byte("x")).WithTag("t1"))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := b.DiscardHalves(ctx); err != nil || n != 1 {
		t.Fatalf("DiscardHalves = %d, %v", n, err)
	}
	rec, _ := newPushConsumer(t, b, discardTopic, nil)
	m := rec.wait(t, ctx, 1)[0]
	if m.MsgId != res.MsgID || m.GetProperty("REAL_TOPIC") != "disc" || m.GetProperty("PGROUP") != group || m.GetTags() != "t1" || string(m.Body) != "x" {
		t.Fatalf("discarded message %v", m)
	}
	if len(b.Pending()) != 0 || len(b.Messages("disc")) != 0 {
		t.Fatal("a discarded half is neither pending nor visible")
	}
}

func TestFailNextSend(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	p := newProducer(t, b, producer.WithRetry(0))
	b.FailNextSend("fail")
	if _, err := p.SendSync(ctx, primitive.NewMessage("fail", []byte("x"))); err == nil {
		t.Fatal("SendSync succeeded; want the broker's SYSTEM_ERROR")
	}
	if _, err := p.SendSync(ctx, primitive.NewMessage("fail", []byte("y"))); err != nil {
		t.Fatalf("the fault is used up, yet: %v", err)
	}
	if msgs := b.Messages("fail"); len(msgs) != 1 || string(msgs[0].Body) != "y" {
		t.Fatalf("stored %+v", msgs)
	}
}

func TestDuplicateNextAndRedeliver(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	b.CreateTopic("dup", 1)
	p := newProducer(t, b)
	b.DuplicateNext("dup")
	res, err := p.SendSync(ctx, primitive.NewMessage("dup", []byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Redeliver(res.OffsetMsgID); err != nil {
		t.Fatal(err)
	}
	if err := b.Redeliver(res.MsgID); err != nil {
		t.Fatal(err)
	}
	if err := b.Redeliver("nope"); err == nil {
		t.Fatal("Redeliver of an unknown id succeeded")
	}
	rec, _ := newPushConsumer(t, b, "dup", nil)
	got := rec.wait(t, ctx, 4)
	seen := map[int64]bool{}
	for i, m := range got {
		if m.MsgId != res.MsgID || m.OffsetMsgId != res.OffsetMsgID {
			t.Fatalf("delivery %d: %v", i, m)
		}
		seen[m.QueueOffset] = true
	}
	if len(seen) != 4 {
		t.Fatalf("queue offsets delivered: %v", seen)
	}
}

func TestHoldAndReleaseReversed(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	b.CreateTopic("held", 1)
	p := newProducer(t, b)
	rec, _ := newPushConsumer(t, b, "held", nil)
	b.Hold("held")
	for _, s := range []string{"v1", "v2", "v3"} {
		if _, err := p.SendSync(ctx, primitive.NewMessage("held", []byte(s))); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(b.Messages("held")); n != 0 {
		t.Fatalf("%d messages visible while held", n)
	}
	b.Release("held", true)
	rec.wait(t, ctx, 3)
	// The push consumer runs deliveries concurrently, so the queue tells the
	// order the broker made them visible in.
	for i, want := range []string{"v3", "v2", "v1"} {
		if m := b.Messages("held")[i]; string(m.Body) != want || m.QueueOffset != int64(i) {
			t.Fatalf("queue offset %d = %s, want %s", i, m.Body, want)
		}
	}
}

func TestConsumeFailureRedeliversThenDeadLetters(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 60*time.Second)
	p := newProducer(t, b)
	res, err := p.SendSync(ctx, primitive.NewMessage("fails", []byte("x")))
	if err != nil {
		t.Fatal(err)
	}
	rec, group := newPushConsumer(t, b, "fails", func(*primitive.MessageExt) consumer.ConsumeResult {
		return consumer.ConsumeRetryLater
	}, consumer.WithMaxReconsumeTimes(1))
	got := rec.wait(t, ctx, 2)
	if got[0].ReconsumeTimes != 0 || got[1].ReconsumeTimes != 1 || got[1].Topic != "fails" || got[1].MsgId != res.MsgID {
		t.Fatalf("deliveries %v / %v", got[0], got[1])
	}
	dl, err := b.WaitMessages(ctx, dlqPrefix+group, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(b.DeadLetters(group)) != 1 || dl[0].MsgID != res.MsgID || string(dl[0].Body) != "x" {
		t.Fatalf("dead letters %+v", dl)
	}
}

func TestKeepRetryDelaysWaitsForAdvance(t *testing.T) {
	b := NewBroker(t, Options{KeepRetryDelays: true})
	ctx := ctxT(t, 60*time.Second)
	p := newProducer(t, b)
	if _, err := p.SendSync(ctx, primitive.NewMessage("later", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	var fails atomic.Int32
	rec, group := newPushConsumer(t, b, "later", func(*primitive.MessageExt) consumer.ConsumeResult {
		if fails.Add(1) == 1 {
			return consumer.ConsumeRetryLater
		}
		return consumer.ConsumeSuccess
	})
	rec.wait(t, ctx, 1)
	waitFor(t, ctx, b, func() bool {
		b.lock()
		defer b.unlock()
		return len(b.delayed) == 1
	})
	// Level 3 (the first retry's) is 10 s.
	if _, err := b.Advance(ctx, 9*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := len(b.Messages(retryPrefix + group)); n != 0 {
		t.Fatalf("retry visible after 9 s: %d", n)
	}
	if _, err := b.Advance(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	if got := rec.wait(t, ctx, 2); got[1].ReconsumeTimes != 1 {
		t.Fatalf("retry %v", got[1])
	}
}

func TestNoAutoCreateRefusesUnknownTopics(t *testing.T) {
	b := NewBroker(t, Options{NoAutoCreate: true})
	ctx := ctxT(t, 30*time.Second)
	if _, err := remoting.TopicRoute(ctx, b.NameServers(), 0, "missing"); !errors.Is(err, remoting.ErrTopicNotFound) {
		t.Fatalf("route of a missing topic: %v", err)
	}
	h, _, err := remoting.RoundTrip(ctx, b.BrokerAddr(), 0, reqSendMessage, map[string]string{"producerGroup": "g", "topic": "missing", "queueId": "0"})
	if err != nil || h.Code != codeTopicNotExist {
		t.Fatalf("raw send: %+v %v", h, err)
	}
	p := newProducer(t, b, producer.WithRetry(0))
	if _, err := p.SendSync(ctx, primitive.NewMessage("missing", []byte("x"))); err == nil {
		t.Fatal("send to a missing topic succeeded")
	}
	b.CreateTopic("present", 2)
	route, err := remoting.TopicRoute(ctx, b.NameServers(), 0, "present")
	if err != nil || len(route) != 1 || route[0].WriteQueues != 2 || route[0].Addr != b.BrokerAddr() {
		t.Fatalf("route %+v %v", route, err)
	}
	if _, err := p.SendSync(ctx, primitive.NewMessage("present", []byte("x"))); err != nil {
		t.Fatal(err)
	}
}

func TestRestartClientsReconnect(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 60*time.Second)
	p := newProducer(t, b)
	rec, _ := newPushConsumer(t, b, "restart", nil)
	if _, err := p.SendSync(ctx, primitive.NewMessage("restart", []byte("before"))); err != nil {
		t.Fatal(err)
	}
	rec.wait(t, ctx, 1)
	if err := b.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.SendSync(ctx, primitive.NewMessage("restart", []byte("after"))); err != nil {
		t.Fatal(err)
	}
	if got := rec.wait(t, ctx, 2); string(got[1].Body) != "after" {
		t.Fatalf("after restart: %v", got[1])
	}
}

func TestStartChecksSeeUsableSettings(t *testing.T) {
	b := NewBroker(t, Options{CheckImmunity: 2 * time.Second, CheckMax: 5})
	ctx := ctxT(t, 30*time.Second)
	masters, err := remoting.ClusterMasters(ctx, b.NameServers(), 0)
	if err != nil || len(masters) != 1 || masters[0] != b.BrokerAddr() {
		t.Fatalf("cluster masters %v %v", masters, err)
	}
	conf, err := remoting.BrokerConfig(ctx, b.BrokerAddr(), 0)
	if err != nil || conf["transactionTimeOut"] != "2000" || conf["transactionCheckMax"] != "5" || conf["transactionCheckInterval"] == "" {
		t.Fatalf("broker config %v %v", conf, err)
	}
	// The name server is no broker, and the broker no name server.
	if h, _, err := remoting.RoundTrip(ctx, b.BrokerAddr(), 0, remoting.ReqGetBrokerClusterInfo, nil); err != nil || h.Code == codeSuccess {
		t.Fatalf("cluster info from the broker: %+v %v", h, err)
	}
	l := &listener{}
	_, group := newTxProducer(t, b, l)
	if ids, err := remoting.ProducerConnections(ctx, b.BrokerAddr(), 0, group); err != nil || len(ids) != 0 {
		t.Fatalf("producer connections before any heartbeat: %v %v", ids, err)
	}
	if err := remoting.CreateTopic(ctx, b.BrokerAddr(), 0, "made", 3); err != nil {
		t.Fatal(err)
	}
	if max, err := remoting.MaxOffset(ctx, b.BrokerAddr(), 0, "made", 2); err != nil || max != 0 {
		t.Fatalf("max offset %d %v", max, err)
	}
	if _, found, err := remoting.ConsumerOffset(ctx, b.BrokerAddr(), 0, "nobody", "made", 0); err != nil || found {
		t.Fatalf("offset of a group without one: found %v, %v", found, err)
	}
	if ids, err := remoting.ConsumerIDs(ctx, b.BrokerAddr(), 0, "nobody"); err != nil || len(ids) != 0 {
		t.Fatalf("consumers of a group without any: %v %v", ids, err)
	}
}

func TestCloseLeaksNoGoroutine(t *testing.T) {
	b, err := Start(Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 30*time.Second)
	// A parked long-polling pull and an idle connection.
	pool := &remoting.Pool{}
	defer pool.Close()
	if _, _, err := pool.RoundTrip(ctx, b.BrokerAddr(), 0, reqGetMaxOffset, map[string]string{"topic": "x", "queueId": "0"}); err != nil {
		t.Fatal(err)
	}
	b.CreateTopic("idle", 1)
	pulled := make(chan error, 1)
	go func() {
		_, _, err := remoting.RoundTrip(ctx, b.BrokerAddr(), 0, reqPullMessage, map[string]string{
			"consumerGroup": "g", "topic": "idle", "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
			"sysFlag": "2", "suspendTimeoutMillis": "20000"})
		pulled <- err
	}()
	waitFor(t, ctx, b, func() bool {
		b.lock()
		defer b.unlock()
		return len(b.parked) == 1
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-pulled; err == nil {
		t.Fatal("the parked pull was answered; Close should drop it")
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "rmqtxtest.(*Broker)") {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("goroutines of the broker left after Close:\n%s", stacks)
		default:
			runtime.Gosched()
		}
	}
}

func TestQueryMessageByKey(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	p := newProducer(t, b)
	res, err := p.SendSync(ctx, primitive.NewMessage("indexed", []byte("x")).WithKeys([]string{"a", "order-7"}))
	if err != nil {
		t.Fatal(err)
	}
	query := func(key string) (int, []*primitive.MessageExt) {
		h, body, err := remoting.RoundTrip(ctx, b.BrokerAddr(), 0, remoting.ReqQueryMessage, map[string]string{
			"topic": "indexed", "key": key, "maxNum": "32", "beginTimestamp": "0", "endTimestamp": "0"})
		if err != nil {
			t.Fatal(err)
		}
		return h.Code, primitive.DecodeMessage(body)
	}
	for _, key := range []string{"order-7", res.MsgID} {
		code, ms := query(key)
		if code != codeSuccess || len(ms) != 1 || ms[0].MsgId != res.MsgID || ms[0].OffsetMsgId != res.OffsetMsgID {
			t.Fatalf("query %s: code %d, %v", key, code, ms)
		}
	}
	if code, _ := query("order-8"); code != codeQueryNotFound {
		t.Fatalf("query of an unknown key: code %d", code)
	}
}

// Client patch 8: the patched client marks a one-way request one-way (bit 1
// of the flag, as the Java client does), so the broker does not answer it;
// the upstream client leaves the bit unset, and the broker builds and
// writes a response nobody reads. A committed transaction's END_TRANSACTION
// and a SendOneWay are the one-way requests here; both arrive, whichever
// the client, and only the patched client marks them.
func TestOneWayRequestsAreMarkedOneWay(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	l := &listener{}
	p, _ := newTxProducer(t, b, l)
	l.exec.Store(int32(primitive.CommitMessageState))
	if _, err := p.SendMessageInTransaction(ctx, primitive.NewMessage("tx", []byte("commit"))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitMessages(ctx, "tx", 1); err != nil {
		t.Fatalf("the END_TRANSACTION arrived and committed the half: %v", err)
	}
	raw := newProducer(t, b)
	if err := raw.SendOneWay(ctx, primitive.NewMessage("oneway", []byte("x"))); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WaitMessages(ctx, "oneway", 1); err != nil {
		t.Fatalf("the one-way send arrived: %v", err)
	}
	b.lock()
	end, send := b.oneway[reqEndTransaction], b.oneway[reqSendMessage]+b.oneway[reqSendMessageV2]
	b.unlock()
	if testenv.PatchedClient() {
		if end != 1 || send != 1 {
			t.Fatalf("patched client: one-way END_TRANSACTION %d, one-way sends %d; want 1 and 1", end, send)
		}
	} else if end != 0 || send != 0 {
		t.Fatalf("upstream client: one-way END_TRANSACTION %d, one-way sends %d; want 0 and 0 (if upstream now sets the flag, patch 8 can go)", end, send)
	}
}
