package remoting_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/internal/broker/pushstop"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// TestConsumerGroupState reads a live group's broker-side state the way the
// crash tests' failure reports do: the consumer ids the broker allocates
// queues by, each queue's committed offset against its end, and the group
// gone once its only consumer has shut down.
func TestConsumerGroupState(t *testing.T) {
	s := testenv.Integration(t)
	topic, group := testenv.Name(t, "topic"), testenv.Name(t, "grp")
	testenv.CreateTopic(t, topic, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const timeout = 5 * time.Second

	ids, err := remoting.ConsumerIDs(ctx, s.Broker, timeout, group)
	if err != nil || len(ids) != 0 {
		t.Fatalf("a group nobody joined: ids %v, err %v", ids, err)
	}
	if _, found, err := remoting.ConsumerOffset(ctx, s.Broker, timeout, group, topic, 0); err != nil || found {
		t.Fatalf("a group nobody joined has no offset: found %t, err %v", found, err)
	}

	if _, err := testenv.Producer(t).SendSync(ctx, primitive.NewMessage(topic, []byte("x"))); err != nil {
		t.Fatalf("send: %v", err)
	}
	// The broker dispatches a stored message to its consume queue
	// asynchronously: wait until the queues show it.
	var end int64
	testenv.Eventually(t, 10*time.Second, "the topic's queues to end at 1 in all (one message)", func() bool {
		end = 0
		for q := 0; q < 2; q++ {
			n, err := remoting.MaxOffset(ctx, s.Broker, timeout, topic, q)
			if err != nil {
				t.Fatalf("max offset of queue %d: %v", q, err)
			}
			end += n
		}
		return end == 1
	})

	gate := pushstop.New(group, []string{s.NameServer})
	var got atomic.Int32
	pc, err := rocketmq.NewPushConsumer(consumer.WithGroupName(group), consumer.WithNsResolver(s.NameServerResolver()),
		consumer.WithInstance(group), consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset), gate.Option())
	if err != nil {
		t.Fatal(err)
	}
	if err := pc.Subscribe(topic, consumer.MessageSelector{}, gate.Wrap(func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		got.Add(int32(len(msgs)))
		return consumer.ConsumeSuccess, nil
	})); err != nil {
		t.Fatal(err)
	}
	if err := pc.Start(); err != nil {
		t.Fatal(err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer scancel()
			if err := gate.Shutdown(sctx, pc); err != nil {
				t.Errorf("shutdown: %v", err)
			}
		}
	}
	defer stop()

	testenv.Eventually(t, time.Minute, "the broker lists the group's consumer", func() bool {
		ids, err = remoting.ConsumerIDs(ctx, s.Broker, timeout, group)
		return err == nil && len(ids) == 1
	})
	if !strings.HasSuffix(ids[0], "@"+group) {
		t.Fatalf("consumer id %q is not this instance's (…@%s)", ids[0], group)
	}
	testenv.Eventually(t, time.Minute, "the message consumed", func() bool { return got.Load() == 1 })

	// The shutdown writes the offsets with confirmed requests (pushstop).
	stop()
	var committed int64
	for q := 0; q < 2; q++ {
		off, found, err := remoting.ConsumerOffset(ctx, s.Broker, timeout, group, topic, q)
		if err != nil {
			t.Fatalf("offset of queue %d: %v", q, err)
		}
		if found {
			committed += off
		}
	}
	if committed != 1 {
		t.Fatalf("the group committed %d in all, want 1 (past the one message)", committed)
	}
	testenv.AwaitGroupEmpty(t, group, time.Minute)
}
