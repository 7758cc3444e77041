package rmqtxtest

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// topic is a topic's queues; a queue is its messages, the index being the
// queue offset (the store never deletes).
type topic struct {
	name   string
	queues [][]*record
}

type queueKey struct {
	topic string
	queue int
}

type offsetKey struct {
	group, topic string
	queue        int
}

// Message is a stored message as a test sees it.
type Message struct {
	Topic, Tags    string
	Keys           []string
	Body           []byte
	Properties     map[string]string
	MsgID          string // the UNIQ_KEY (client message id); the offset id when it has none
	OffsetMsgID    string
	QueueID        int
	QueueOffset    int64
	ReconsumeTimes int
}

// implicitTopic reports whether name exists without being created: the
// retry and dead-letter topics of a group (a real broker creates them on
// the group's heartbeat or first send-back).
func implicitTopic(name string) bool {
	return strings.HasPrefix(name, retryPrefix) || strings.HasPrefix(name, dlqPrefix)
}

// topicLocked returns topic name, creating it when create is true or the
// topic is implicit. nil when it does not exist.
func (b *Broker) topicLocked(name string, create bool) *topic {
	if t, ok := b.topics[name]; ok {
		return t
	}
	if implicitTopic(name) {
		return b.createTopicLocked(name, 1)
	}
	if create {
		return b.createTopicLocked(name, b.opts.Queues)
	}
	return nil
}

// createTopicLocked creates name with queues queues, or grows it to that
// many (queues are never removed).
func (b *Broker) createTopicLocked(name string, queues int) *topic {
	if queues <= 0 {
		queues = b.opts.Queues
	}
	t, ok := b.topics[name]
	if !ok {
		t = &topic{name: name}
		b.topics[name] = t
	}
	for len(t.queues) < queues {
		t.queues = append(t.queues, nil)
	}
	return t
}

// CreateTopic creates topic with queues queues (0: Options.Queues), or
// grows an existing one to that many. The name server routes it at once.
func (b *Broker) CreateTopic(topic string, queues int) {
	b.lock()
	defer b.unlock()
	b.createTopicLocked(topic, queues)
	b.broadcastLocked()
}

// storeLocked gives r a commit log offset and remembers it by that offset.
func (b *Broker) storeLocked(r *record) {
	r.commitOffset = b.commitNext
	b.commitNext += int64(r.encodedSize())
	if _, ok := b.byOffset[r.commitOffset]; !ok {
		b.byOffset[r.commitOffset] = r
	}
}

// appendLocked makes r visible on its queue (or holds it, see Hold) and
// answers the pulls parked on that queue. r already has its commit log
// offset. It returns the queue offset r got (or would get, when held).
func (b *Broker) appendLocked(r *record) int64 {
	t := b.topicLocked(r.topic, true)
	if r.queueID < 0 || r.queueID >= len(t.queues) {
		r.queueID = ((r.queueID % len(t.queues)) + len(t.queues)) % len(t.queues)
	}
	if b.holding[r.topic] {
		pending := int64(0)
		for _, h := range b.held[r.topic] {
			if h.queueID == r.queueID {
				pending++
			}
		}
		b.held[r.topic] = append(b.held[r.topic], r)
		return int64(len(t.queues[r.queueID])) + pending
	}
	r.queueOffset = int64(len(t.queues[r.queueID]))
	t.queues[r.queueID] = append(t.queues[r.queueID], r)
	b.wakeParkedLocked(queueKey{r.topic, r.queueID})
	b.broadcastLocked()
	return r.queueOffset
}

// duplicateLocked reports whether a DuplicateNext fault matches topic, and
// uses it up.
func (b *Broker) duplicateLocked(topic string) bool {
	return takeFault(&b.dupNext, topic)
}

// takeFault removes and reports the first fault of list that matches topic
// ("" matches any topic).
func takeFault(list *[]string, topic string) bool {
	for i, t := range *list {
		if t == "" || t == topic {
			*list = append((*list)[:i], (*list)[i+1:]...)
			return true
		}
	}
	return false
}

// publishLocked stores r and makes it visible, twice when a DuplicateNext
// fault matches its topic (same UNIQ_KEY, same offset id: a redelivery).
func (b *Broker) publishLocked(r *record) int64 {
	b.storeLocked(r)
	off := b.appendLocked(r)
	if b.duplicateLocked(r.topic) {
		b.appendLocked(r.clone())
	}
	return off
}

func (b *Broker) messageOf(r *record) Message {
	m := Message{
		Topic: r.topic, Tags: r.props["TAGS"], Body: plainBody(r), Properties: map[string]string{},
		OffsetMsgID: offsetMsgID(b.storeHost, r.commitOffset), QueueID: r.queueID, QueueOffset: r.queueOffset,
		ReconsumeTimes: int(r.reconsumeTimes),
	}
	for k, v := range r.props {
		m.Properties[k] = v
	}
	if k := r.props["KEYS"]; k != "" {
		m.Keys = strings.Fields(k)
	}
	m.MsgID = r.props["UNIQ_KEY"]
	if m.MsgID == "" {
		m.MsgID = m.OffsetMsgID
	}
	return m
}

// Messages returns the visible messages of topic, in queue order per
// queue, queues in id order (duplicates included).
func (b *Broker) Messages(topic string) []Message {
	b.lock()
	defer b.unlock()
	return b.messagesLocked(topic)
}

func (b *Broker) messagesLocked(topic string) []Message {
	t, ok := b.topics[topic]
	if !ok {
		return nil
	}
	var out []Message
	for _, q := range t.queues {
		for _, r := range q {
			out = append(out, b.messageOf(r))
		}
	}
	return out
}

// DeadLetters returns the messages of group's dead-letter topic (%DLQ%group).
func (b *Broker) DeadLetters(group string) []Message { return b.Messages(dlqPrefix + group) }

// WaitMessages waits until topic has at least n visible messages and
// returns them (as Messages), or returns ctx's error with what there is.
func (b *Broker) WaitMessages(ctx context.Context, topic string, n int) ([]Message, error) {
	for {
		b.lock()
		if b.closed {
			b.unlock()
			return nil, ErrClosed
		}
		msgs := b.messagesLocked(topic)
		ch := b.changed
		b.unlock()
		if len(msgs) >= n {
			return msgs, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return msgs, fmt.Errorf("rmqtxtest: wait for %d messages on %s (have %d): %w", n, topic, len(msgs), ctx.Err())
		}
	}
}

// Hold stops making new messages of topic visible to consumers (sends are
// accepted and answered) until Release.
func (b *Broker) Hold(topic string) {
	b.lock()
	defer b.unlock()
	b.holding[topic] = true
}

// Release makes the messages held on topic visible, in the order they were
// stored or, with reverse, in the opposite order (a reordering), and stops
// holding topic.
func (b *Broker) Release(topic string, reverse bool) {
	b.lock()
	defer b.unlock()
	held := b.held[topic]
	delete(b.held, topic)
	delete(b.holding, topic)
	for i := range held {
		r := held[i]
		if reverse {
			r = held[len(held)-1-i]
		}
		b.appendLocked(r)
	}
	b.broadcastLocked()
}

// Redeliver appends another copy of a stored message to its queue, as a
// rebalance does to a message that was delivered and not acknowledged.
// msgID is its UNIQ_KEY or its offset message id; the copy keeps both.
func (b *Broker) Redeliver(msgID string) error {
	b.lock()
	defer b.unlock()
	if b.closed {
		return ErrClosed
	}
	if r := b.findLocked(msgID); r != nil {
		b.appendLocked(r.clone())
		return nil
	}
	return fmt.Errorf("rmqtxtest: redeliver: no visible message %q", msgID)
}

// findLocked returns the first visible message with UNIQ_KEY or offset id
// msgID.
func (b *Broker) findLocked(msgID string) *record {
	if off, ok := offsetOfMsgID(msgID); ok {
		if r, ok := b.byOffset[off]; ok && r.topic != halfTopic && b.visibleLocked(r) {
			return r
		}
	}
	for _, t := range b.topics {
		for _, q := range t.queues {
			for _, r := range q {
				if r.props["UNIQ_KEY"] == msgID {
					return r
				}
			}
		}
	}
	return nil
}

func (b *Broker) visibleLocked(r *record) bool {
	t, ok := b.topics[r.topic]
	if !ok || r.queueID >= len(t.queues) {
		return false
	}
	q := t.queues[r.queueID]
	return r.queueOffset < int64(len(q)) && q[r.queueOffset] == r
}

// DuplicateNext makes the next message stored on topic (a committed half
// or a plain send) be stored twice, with the same UNIQ_KEY and offset id:
// a redelivery. "" matches any topic.
func (b *Broker) DuplicateNext(topic string) {
	b.lock()
	defer b.unlock()
	b.dupNext = append(b.dupNext, topic)
}

// Now returns the broker's clock: it starts at the time of Start and moves
// only by Advance.
func (b *Broker) Now() time.Time {
	b.lock()
	defer b.unlock()
	return b.clock
}

// releaseDueLocked makes the delayed retries whose time has come visible.
func (b *Broker) releaseDueLocked() {
	now := b.clock.UnixMilli()
	keep := b.delayed[:0]
	var due []*record
	for _, r := range b.delayed {
		if r.dueAt <= now {
			due = append(due, r)
		} else {
			keep = append(keep, r)
		}
	}
	b.delayed = keep
	for _, r := range due {
		b.appendLocked(r)
	}
}
