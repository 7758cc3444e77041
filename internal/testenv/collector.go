package testenv

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/internal/broker/pushstop"
	"github.com/rmqtx/rmqtx/wire"
)

// Collector is a raw push consumer that records every delivery on a topic,
// keyed by rmqtx event id (or UNIQ_KEY for messages without one). It is the
// independent "what did a consumer finally see" view in integration tests.
type Collector struct {
	mu     sync.Mutex
	counts map[string]int
	msgs   map[string]*primitive.MessageExt
	stored map[string]map[storedAt]bool // the distinct stored messages per id
	total  int
	cond   chan struct{}
	pc     rocketmq.PushConsumer
}

// Collect starts a Collector on topic under a fresh group. It is shut down
// when the test ends.
func Collect(t testing.TB, topic string) *Collector {
	t.Helper()
	s := Integration(t)
	c := &Collector{counts: map[string]int{}, msgs: map[string]*primitive.MessageExt{}, stored: map[string]map[storedAt]bool{},
		cond: make(chan struct{})}
	group := Name(t, "collect")
	// The gate stops delivery before the client's Shutdown, which on the
	// upstream client can panic while a pull delivers (internal/broker/pushstop).
	// No name servers: nothing resumes the group, its offsets need no write.
	gate := pushstop.New(group, nil)
	pc, err := rocketmq.NewPushConsumer(
		consumer.WithGroupName(group),
		consumer.WithNsResolver(s.NameServerResolver()),
		consumer.WithInstance(group),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
		gate.Option(),
	)
	if err != nil {
		t.Fatalf("testenv: collector: %v", err)
	}
	err = pc.Subscribe(topic, consumer.MessageSelector{}, gate.Wrap(func(_ context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		c.mu.Lock()
		for _, m := range msgs {
			id := m.GetProperty(wire.PropEventID)
			if id == "" {
				id = m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex)
			}
			c.counts[id]++
			if _, ok := c.msgs[id]; !ok {
				c.msgs[id] = m
			}
			if c.stored[id] == nil {
				c.stored[id] = map[storedAt]bool{}
			}
			c.stored[id][storedAtOf(m)] = true
			c.total++
		}
		close(c.cond)
		c.cond = make(chan struct{})
		c.mu.Unlock()
		return consumer.ConsumeSuccess, nil
	}))
	if err != nil {
		t.Fatalf("testenv: collector subscribe: %v", err)
	}
	if err := pc.Start(); err != nil {
		t.Fatalf("testenv: collector start: %v", err)
	}
	c.pc = pc
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = gate.Shutdown(ctx, pc)
	})
	return c
}

// Snapshot is a copy of what the collector has seen.
type Snapshot struct {
	Counts map[string]int // deliveries per event id
	Total  int            // all deliveries, duplicates included
}

// Distinct is the number of distinct event ids seen.
func (s Snapshot) Distinct() int { return len(s.Counts) }

// Snapshot returns a copy of the current state.
func (c *Collector) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	cp := make(map[string]int, len(c.counts))
	for k, v := range c.counts {
		cp[k] = v
	}
	return Snapshot{Counts: cp, Total: c.total}
}

// storedAt is where the broker stored one message: a redelivery of it has
// the same place, a second copy (a re-store, a republish, a re-send) another.
type storedAt struct {
	broker string
	queue  int
	offset int64
}

func storedAtOf(m *primitive.MessageExt) storedAt {
	at := storedAt{offset: m.QueueOffset}
	if m.Queue != nil {
		at.broker, at.queue = m.Queue.BrokerName, m.Queue.QueueId
	}
	return at
}

// Stored returns, per id, how many distinct stored messages (broker, queue,
// queue offset) carried it: 1 for an event stored once however often it
// was delivered, more for copies stored again.
func (c *Collector) Stored() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.stored))
	for id, at := range c.stored {
		out[id] = len(at)
	}
	return out
}

// Message returns the first delivery of id, or nil.
func (c *Collector) Message(id string) *primitive.MessageExt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.msgs[id]
}

// WaitUntil blocks until cond holds for the collector's state or timeout
// passes, re-evaluating on every delivery. It reports whether cond held.
func (c *Collector) WaitUntil(timeout time.Duration, cond func(Snapshot) bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ch := c.cond
		c.mu.Unlock()
		if cond(c.Snapshot()) {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return cond(c.Snapshot())
		}
	}
}

// WaitDistinct waits for at least n distinct ids and fails the test with
// what was seen when they do not arrive within timeout.
func (c *Collector) WaitDistinct(t testing.TB, n int, timeout time.Duration) Snapshot {
	t.Helper()
	if !c.WaitUntil(timeout, func(s Snapshot) bool { return s.Distinct() >= n }) {
		s := c.Snapshot()
		t.Fatalf("testenv: collector saw %d distinct ids (%d deliveries), want %d within %s", s.Distinct(), s.Total, n, timeout)
	}
	return c.Snapshot()
}

// Eventually polls cond every 50ms until it returns true or timeout passes,
// and fails t then. It is for conditions that have no notification (rows in
// a table); it never stands in for a fixed sleep.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Await(timeout, cond) {
		t.Fatalf("testenv: timed out after %s waiting for %s", timeout, what)
	}
}

// Await is Eventually for a caller that reports the failure itself: it
// polls cond every 50ms and reports whether it held within timeout.
func Await(timeout time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// Describe renders a delivered message for a failure report: where the
// broker stored it, its size and its property keys, with the values of the
// broker's and client's own properties only (never the body or user
// properties, which may carry payload data).
func Describe(m *primitive.MessageExt) string {
	if m == nil {
		return "<nil>"
	}
	props := m.GetProperties()
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "topic=%s queue=%d offset=%d msgId=%s offsetMsgId=%s store=%s born=%s stored=%s reconsume=%d flag=%d sysFlag=%d body=%dB props[",
		m.Topic, m.Queue.QueueId, m.QueueOffset, m.MsgId, m.OffsetMsgId, m.StoreHost, m.BornHost,
		time.UnixMilli(m.StoreTimestamp).UTC().Format("15:04:05.000"), m.ReconsumeTimes, m.Flag, m.SysFlag, len(m.Body))
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k)
		if describedProps[k] {
			b.WriteString("=" + props[k])
		}
	}
	b.WriteString("]")
	return b.String()
}

// describedProps are the properties whose values Describe prints: the
// broker's and client's own, which carry no user data (not KEYS, which holds
// business keys), and the rmqtx event id.
var describedProps = map[string]bool{
	wire.PropEventID: true,
	primitive.PropertyUniqueClientMessageIdKeyIndex:  true,
	primitive.PropertyTags:                           true,
	primitive.PropertyRealTopic:                      true,
	primitive.PropertyRealQueueId:                    true,
	primitive.PropertyTransactionPrepared:            true,
	primitive.PropertyProducerGroup:                  true,
	primitive.PropertyDelayTimeLevel:                 true,
	primitive.PropertyRetryTopic:                     true,
	primitive.PropertyOriginMessageId:                true,
	primitive.PropertyReconsumeTime:                  true,
	primitive.PropertyMinOffset:                      true,
	primitive.PropertyMaxOffset:                      true,
	primitive.PropertyCluster:                        true,
	primitive.PropertyMsgRegion:                      true,
	primitive.PropertyTraceSwitch:                    true,
	primitive.PropertyConsumeStartTime:               true,
	primitive.PropertyTranscationPreparedQueueOffset: true,
	"__CRC32#": true,
}
