package rmqtxtest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
)

// countingListener commits every local transaction and counts the calls.
type countingListener struct{ execs atomic.Int32 }

func (l *countingListener) ExecuteLocalTransaction(*primitive.Message) primitive.LocalTransactionState {
	l.execs.Add(1)
	return primitive.CommitMessageState
}

func (l *countingListener) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	return primitive.UnkonwnState
}

func newCountingTxProducer(t *testing.T, b *Broker, l *countingListener) rocketmq.TransactionProducer {
	t.Helper()
	p, err := rocketmq.NewTransactionProducer(l,
		producer.WithNsResolver(primitive.NewPassthroughResolver(b.NameServers())),
		producer.WithGroupName(uniq("txg")), producer.WithInstanceName(uniq("txi")),
		producer.WithSendMsgTimeout(3*time.Second), producer.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}

// StatusNext stores the next send of its topic and answers it with the
// status, as a SYNC_MASTER without its slave (or a SYNC_FLUSH broker with a
// slow disk) does: the client reports each status for a plain send, and for
// a half it ends the half with ROLLBACK without calling the listener. Only
// one send is affected, only on the topic named, and a status that a stored
// message never has is refused.
func TestStatusNext(t *testing.T) {
	b := NewBroker(t)
	ctx := ctxT(t, 30*time.Second)
	if err := b.StatusNext("plain", StoreStatus(1)); err == nil {
		t.Fatal("StatusNext accepted SYSTEM_ERROR, which is not the status of a stored message")
	}

	p := newProducer(t, b, producer.WithRetry(0))
	want := map[StoreStatus]primitive.SendStatus{
		FlushDiskTimeout:  primitive.SendFlushDiskTimeout,
		SlaveNotAvailable: primitive.SendSlaveNotAvailable,
		FlushSlaveTimeout: primitive.SendFlushSlaveTimeout,
	}
	for _, s := range []StoreStatus{FlushDiskTimeout, SlaveNotAvailable, FlushSlaveTimeout} {
		if err := b.StatusNext("plain", s); err != nil {
			t.Fatal(err)
		}
		body := s.String()
		r, err := p.SendSync(ctx, primitive.NewMessage("plain", []byte(body)))
		if err != nil {
			t.Fatalf("%s: SendSync: %v", s, err)
		}
		if r.Status != want[s] || r.OffsetMsgID == "" {
			t.Fatalf("%s: send result %+v, want status %d with the stored message's id", s, r, want[s])
		}
		msgs := b.Messages("plain")
		if last := msgs[len(msgs)-1]; string(last.Body) != body {
			t.Fatalf("%s: the message answered %s is not stored: last stored %q", s, s, last.Body)
		}
	}
	if r, err := p.SendSync(ctx, primitive.NewMessage("plain", []byte("ok"))); err != nil || r.Status != primitive.SendOK {
		t.Fatalf("the faults are used up, yet: %+v, %v", r, err)
	}
	if n := len(b.Messages("plain")); n != 4 {
		t.Fatalf("%d messages stored on plain, want 4", n)
	}

	// A fault on another topic leaves this one alone.
	l := &countingListener{}
	tp := newCountingTxProducer(t, b, l)
	if err := b.StatusNext("elsewhere", SlaveNotAvailable); err != nil {
		t.Fatal(err)
	}
	ok, err := tp.SendMessageInTransaction(ctx, primitive.NewMessage("tx", []byte("ok")))
	if err != nil || ok.Status != primitive.SendOK || ok.State != primitive.CommitMessageState || l.execs.Load() != 1 {
		t.Fatalf("a fault on another topic changed this send: %+v, %v, %d listener calls", ok, err, l.execs.Load())
	}
	if _, err := b.WaitMessages(ctx, "tx", 1); err != nil {
		t.Fatal(err)
	}
	if r, err := p.SendSync(ctx, primitive.NewMessage("elsewhere", []byte("x"))); err != nil || r.Status != primitive.SendSlaveNotAvailable {
		t.Fatalf("the fault of topic elsewhere: %+v, %v", r, err)
	}

	// A half answered SLAVE_NOT_AVAILABLE: stored, rolled back by the
	// client, the listener not called.
	if err := b.StatusNext("tx", SlaveNotAvailable); err != nil {
		t.Fatal(err)
	}
	forced, err := tp.SendMessageInTransaction(ctx, primitive.NewMessage("tx", []byte("forced")))
	if err != nil {
		t.Fatal(err)
	}
	if forced.Status != primitive.SendSlaveNotAvailable || forced.State != primitive.RollbackMessageState {
		t.Fatalf("half answered SLAVE_NOT_AVAILABLE: %+v", forced)
	}
	if n := l.execs.Load(); n != 1 {
		t.Fatalf("the listener ran %d times, want 1 (not for the half answered SLAVE_NOT_AVAILABLE)", n)
	}
	waitFor(t, ctx, b, func() bool { return len(b.RolledBack()) == 1 })
	if rb := b.RolledBack(); rb[0].MsgID != forced.MsgID || string(rb[0].Body) != "forced" {
		t.Fatalf("rolled back %+v, want the half %s", rb[0], forced.MsgID)
	}
	if len(b.Pending()) != 0 || len(b.Messages("tx")) != 1 {
		t.Fatalf("pending %d, stored on tx %d: want 0 and 1", len(b.Pending()), len(b.Messages("tx")))
	}
}
