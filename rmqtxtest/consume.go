package rmqtxtest

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Consumption: pulls with long polling, consumer offsets, and send-back to
// the retry and dead-letter topics.

// parkedPull is a long-polling pull that found nothing: it is answered as
// soon as a message arrives on its queue, or with PULL_NOT_FOUND when its
// suspend time (the client's, a wall-clock wait of the client) runs out.
type parkedPull struct {
	c     *conn
	req   *command
	key   queueKey
	timer *time.Timer
}

var opaqueSeq atomic.Int32

// nextOpaque numbers the broker's own requests (checks, notifications).
func nextOpaque() int32 { return opaqueSeq.Add(1) }

// FailNextPull makes the next pull of topic fail with SYSTEM_ERROR; the
// client retries it after its error delay (3 s). "" matches any topic.
func (b *Broker) FailNextPull(topic string) {
	b.lock()
	defer b.unlock()
	b.failPull = append(b.failPull, topic)
}

func (b *Broker) handlePull(c *conn, req *command) *command {
	b.lock()
	defer b.unlock()
	topicName := req.ext("topic")
	if b.closed || b.draining {
		return newResponse(req, codeSystemError, "broker restarting", nil)
	}
	if takeFault(&b.failPull, topicName) {
		return newResponse(req, codeSystemError, "rmqtxtest: FailNextPull", nil)
	}
	sysFlag := req.extInt("sysFlag")
	if sysFlag&1 != 0 { // the client commits its offset with the pull
		if off := req.extInt("commitOffset"); off > 0 {
			b.offsets[offsetKey{req.ext("consumerGroup"), topicName, int(req.extInt("queueId"))}] = off
		}
	}
	resp, empty := b.pullLocked(req)
	if !empty || sysFlag&2 == 0 {
		return resp
	}
	wait := time.Duration(req.extInt("suspendTimeoutMillis")) * time.Millisecond
	if wait <= 0 || wait > 20*time.Second {
		wait = 20 * time.Second
	}
	p := &parkedPull{c: c, req: req, key: queueKey{topicName, int(req.extInt("queueId"))}}
	b.parked[p.key] = append(b.parked[p.key], p)
	b.broadcastLocked()
	b.wg.Add(1)
	p.timer = time.AfterFunc(wait, func() {
		defer b.wg.Done()
		b.lock()
		defer b.unlock()
		if b.unparkLocked(p) {
			resp, _ := b.pullLocked(p.req)
			b.sendLocked(p.c, resp)
		}
	})
	return nil
}

// unparkLocked removes p from the parked pulls; false if it was not there.
func (b *Broker) unparkLocked(p *parkedPull) bool {
	list := b.parked[p.key]
	for i, q := range list {
		if q == p {
			b.parked[p.key] = append(list[:i], list[i+1:]...)
			if len(b.parked[p.key]) == 0 {
				delete(b.parked, p.key)
			}
			return true
		}
	}
	return false
}

// wakeParkedLocked answers the pulls parked on k that now find messages.
func (b *Broker) wakeParkedLocked(k queueKey) {
	for _, p := range append([]*parkedPull(nil), b.parked[k]...) {
		resp, empty := b.pullLocked(p.req)
		if empty {
			continue
		}
		if p.timer.Stop() {
			b.wg.Done()
		}
		b.unparkLocked(p)
		b.sendLocked(p.c, resp)
	}
}

// stopParkedLocked drops the parked pulls of c (all when c is nil) without
// answering them.
func (b *Broker) stopParkedLocked(c *conn) {
	for _, list := range b.parked {
		for _, p := range append([]*parkedPull(nil), list...) {
			if c != nil && p.c != c {
				continue
			}
			if p.timer.Stop() {
				b.wg.Done()
			}
			b.unparkLocked(p)
		}
	}
}

// subscriptionLocked returns the tags a pull of group on topic filters by:
// the pull's own expression when it carries one, else the group's
// registered subscription; nil means every message.
func (b *Broker) subscriptionLocked(req *command) map[string]bool {
	expr := ""
	if req.extInt("sysFlag")&4 != 0 {
		expr = req.ext("subscription")
	} else {
		group, topicName := req.ext("consumerGroup"), req.ext("topic")
		for _, cl := range b.clients {
			if s, ok := cl.consumers[group].subs[topicName]; ok {
				expr = s
				break
			}
		}
	}
	if t := req.ext("expressionType"); t != "" && t != "TAG" {
		return nil // SQL92 filters are not evaluated: every message matches
	}
	expr = strings.TrimSpace(expr)
	if expr == "" || expr == "*" {
		return nil
	}
	tags := map[string]bool{}
	for _, t := range strings.Split(expr, "||") {
		if t = strings.TrimSpace(t); t != "" {
			tags[t] = true
		}
	}
	return tags
}

// pullLocked computes the answer to a pull; empty reports that it found no
// message at all (the case a long-polling pull waits in).
func (b *Broker) pullLocked(req *command) (resp *command, empty bool) {
	topicName := req.ext("topic")
	qid := int(req.extInt("queueId"))
	offset := req.extInt("queueOffset")
	max := int(req.extInt("maxMsgNums"))
	if max <= 0 {
		max = 32
	}
	t := b.topicLocked(topicName, false)
	if t == nil {
		return newResponse(req, codeTopicNotExist, fmt.Sprintf("topic[%s] not exist, apply first please!", topicName), nil), false
	}
	if qid < 0 || qid >= len(t.queues) {
		return newResponse(req, codeSystemError, fmt.Sprintf("queueId[%d] is illegal, topic:[%s] topicConfig.readQueueNums:[%d]", qid, topicName, len(t.queues)), nil), false
	}
	q := t.queues[qid]
	maxOff := int64(len(q))
	ext := func(next int64) map[string]string {
		return map[string]string{"nextBeginOffset": strconv.FormatInt(next, 10), "minOffset": "0",
			"maxOffset": strconv.FormatInt(maxOff, 10), "suggestWhichBrokerId": "0"}
	}
	switch {
	case offset < 0:
		return newResponse(req, codePullOffsetMoved, "offset too small", ext(0)), false
	case offset > maxOff:
		return newResponse(req, codePullOffsetMoved, "offset overflow", ext(maxOff)), false
	case offset == maxOff:
		return newResponse(req, codePullNotFound, "no new message", ext(offset)), true
	}
	tags := b.subscriptionLocked(req)
	var body []byte
	n := 0
	next := offset
	for ; next < maxOff && n < max; next++ {
		r := q[next]
		if tags != nil && !tags[r.props["TAGS"]] {
			continue
		}
		body = append(body, r.encode(b.storeHost)...)
		n++
	}
	if n == 0 {
		return newResponse(req, codePullRetryNow, "no matched message", ext(next)), false
	}
	resp = newResponse(req, codeSuccess, "", ext(next))
	resp.Body = body
	return resp, false
}

func (b *Broker) handleQueryOffset(req *command) *command {
	b.lock()
	defer b.unlock()
	k := offsetKey{req.ext("consumerGroup"), req.ext("topic"), int(req.extInt("queueId"))}
	if off, ok := b.offsets[k]; ok {
		return newResponse(req, codeSuccess, "", map[string]string{"offset": strconv.FormatInt(off, 10)})
	}
	// A real broker answers 0 for a group without an offset while the
	// queue still holds its first message (min offset 0, in memory): a new
	// group then reads from the start, whatever its ConsumeFromWhere.
	// rmqtx asks with setZeroIfNotFound=false to learn there is none.
	if v := req.ext("setZeroIfNotFound"); v == "false" {
		return newResponse(req, codeQueryNotFound, "Not found, do not set to zero, maybe this group boot first", nil)
	}
	return newResponse(req, codeSuccess, "", map[string]string{"offset": "0"})
}

func (b *Broker) handleUpdateOffset(req *command) *command {
	b.lock()
	defer b.unlock()
	k := offsetKey{req.ext("consumerGroup"), req.ext("topic"), int(req.extInt("queueId"))}
	b.offsets[k] = req.extInt("commitOffset")
	b.broadcastLocked()
	return newResponse(req, codeSuccess, "", nil)
}

// handleMinMaxOffset answers GET_MAX_OFFSET (the offset after the last
// message) and GET_MIN_OFFSET (always 0: the store never deletes).
func (b *Broker) handleMinMaxOffset(req *command) *command {
	b.lock()
	defer b.unlock()
	off := int64(0)
	if req.Code == reqGetMaxOffset {
		if t := b.topicLocked(req.ext("topic"), false); t != nil {
			if q := int(req.extInt("queueId")); q >= 0 && q < len(t.queues) {
				off = int64(len(t.queues[q]))
			}
		}
	}
	return newResponse(req, codeSuccess, "", map[string]string{"offset": strconv.FormatInt(off, 10)})
}

// handleSearchOffset answers the offset of the first message of the queue
// stored at or after timestamp (the queue's end when none).
func (b *Broker) handleSearchOffset(req *command) *command {
	b.lock()
	defer b.unlock()
	ts := req.extInt("timestamp")
	off := int64(0)
	if t := b.topicLocked(req.ext("topic"), false); t != nil {
		if qi := int(req.extInt("queueId")); qi >= 0 && qi < len(t.queues) {
			q := t.queues[qi]
			off = int64(len(q))
			for i, r := range q {
				if r.storeTimestamp >= ts {
					off = int64(i)
					break
				}
			}
		}
	}
	return newResponse(req, codeSuccess, "", map[string]string{"offset": strconv.FormatInt(off, 10)})
}

// Retry delay levels of the broker (messageDelayLevel), level 1 first.
var delayLevels = []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute,
	2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute, 6 * time.Minute, 7 * time.Minute,
	8 * time.Minute, 9 * time.Minute, 10 * time.Minute, 20 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour}

// handleSendBack stores a message the consumer failed to consume on the
// group's retry topic with reconsumeTimes+1, or on its dead-letter topic
// once it was reconsumed maxReconsumeTimes times (CONSUMER_SEND_MSG_BACK).
func (b *Broker) handleSendBack(req *command) *command {
	group := req.ext("group")
	b.lock()
	defer b.unlock()
	orig := b.byOffset[req.extInt("offset")]
	if orig == nil || orig.topic == halfTopic {
		return newResponse(req, codeSystemError, "look message by offset failed", nil)
	}
	max := int32(req.extInt("maxReconsumeTimes"))
	if _, ok := req.ExtFields["maxReconsumeTimes"]; !ok || max < 0 {
		max = 16
	}
	delay := int(req.extInt("delayLevel"))
	r := orig.clone()
	if r.props["RETRY_TOPIC"] == "" {
		r.props["RETRY_TOPIC"] = orig.topic
	}
	if r.props["ORIGIN_MESSAGE_ID"] == "" {
		id := req.ext("originMsgId")
		if id == "" {
			id = offsetMsgID(b.storeHost, orig.commitOffset)
		}
		r.props["ORIGIN_MESSAGE_ID"] = id
	}
	r.storeTimestamp = b.clock.UnixMilli()
	if orig.reconsumeTimes >= max || delay < 0 {
		r.topic, r.queueID = dlqPrefix+group, 0
		r.props["REAL_TOPIC"], r.props["REAL_QID"] = r.topic, "0"
		b.storeLocked(r)
		b.appendLocked(r)
		return newResponse(req, codeSuccess, "", nil)
	}
	if delay == 0 {
		delay = 3 + int(orig.reconsumeTimes)
	}
	if delay > len(delayLevels) {
		delay = len(delayLevels)
	}
	r.reconsumeTimes = orig.reconsumeTimes + 1
	r.topic, r.queueID = retryPrefix+group, 0
	// The real broker passes a retry through its delay queue, which leaves
	// the retry topic in REAL_TOPIC (checkback.Redelivered reads it).
	r.props["REAL_TOPIC"], r.props["REAL_QID"] = r.topic, "0"
	r.props["DELAY"] = strconv.Itoa(delay)
	b.storeLocked(r)
	if b.opts.KeepRetryDelays {
		r.dueAt = b.clock.Add(delayLevels[delay-1]).UnixMilli()
		b.topicLocked(r.topic, true)
		b.delayed = append(b.delayed, r)
		return newResponse(req, codeSuccess, "", nil)
	}
	b.appendLocked(r)
	return newResponse(req, codeSuccess, "", nil)
}

// handleLockBatch grants every queue asked for (orderly consumers lock
// their queues; one broker, no contention to arbitrate).
func (b *Broker) handleLockBatch(req *command) *command {
	var body struct {
		MQSet []json.RawMessage `json:"mqSet"`
	}
	if err := json.Unmarshal(req.Body, &body); err != nil {
		return newResponse(req, codeSystemError, "bad lock request", nil)
	}
	out, err := json.Marshal(map[string]any{"lockOKMQSet": body.MQSet})
	if err != nil {
		return newResponse(req, codeSystemError, err.Error(), nil)
	}
	resp := newResponse(req, codeSuccess, "", nil)
	resp.Body = out
	return resp
}
