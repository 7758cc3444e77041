package rmqtxtest

import (
	"fmt"
	"strconv"
	"strings"
)

// sendHeader is a SEND_MESSAGE header; SEND_MESSAGE_V2 and
// SEND_BATCH_MESSAGE carry the same fields under one-letter names.
type sendHeader struct {
	group, topic   string
	queueID        int
	sysFlag        int32
	bornTimestamp  int64
	flag           int32
	properties     string
	reconsumeTimes int32
	batch          bool
}

func parseSendHeader(req *command) sendHeader {
	f := func(long, short string) string {
		if req.Code == reqSendMessage {
			return req.ext(long)
		}
		return req.ext(short)
	}
	n := func(long, short string) int64 {
		v, _ := strconv.ParseInt(f(long, short), 10, 64)
		return v
	}
	bt, _ := strconv.ParseBool(f("batch", "m"))
	return sendHeader{
		group: f("producerGroup", "a"), topic: f("topic", "b"), queueID: int(n("queueId", "e")),
		sysFlag: int32(n("sysFlag", "f")), bornTimestamp: n("bornTimestamp", "g"), flag: int32(n("flag", "h")),
		properties: f("properties", "i"), reconsumeTimes: int32(n("reconsumeTimes", "j")),
		batch: bt || req.Code == reqSendBatchMessage,
	}
}

// FailNextSend makes the next send (plain, batch or half) to topic fail
// with SYSTEM_ERROR (code 1); "" matches any topic. The client retries a
// failed send on another queue, up to its retry count, so to make SendSync
// fail call it once per attempt (the client's WithRetry, default 2: three
// attempts).
func (b *Broker) FailNextSend(topic string) {
	b.lock()
	defer b.unlock()
	b.failSend = append(b.failSend, topic)
}

// StoreStatus is a status with which a broker answers a send it stored
// but could not make as durable as configured: the message is in the
// commit log all the same, and the answer carries its id and offset. Its
// value is the broker's response code (ResponseCode), which the client
// turns into a send status rather than an error.
type StoreStatus int

// The statuses of a stored message that is not SEND_OK.
const (
	// FlushDiskTimeout: a SYNC_FLUSH broker did not flush the message to
	// disk within syncFlushTimeout.
	FlushDiskTimeout StoreStatus = 10
	// SlaveNotAvailable: a SYNC_MASTER has no slave in sync to copy the
	// message to (the slave is down or too far behind).
	SlaveNotAvailable StoreStatus = 11
	// FlushSlaveTimeout: a SYNC_MASTER's slave did not confirm the copy
	// within syncFlushTimeout.
	FlushSlaveTimeout StoreStatus = 12
)

// String is the broker's name of the status.
func (s StoreStatus) String() string {
	switch s {
	case FlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT"
	case SlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE"
	case FlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT"
	}
	return "StoreStatus(" + strconv.Itoa(int(s)) + ")"
}

// statusFault is one pending StatusNext.
type statusFault struct {
	topic  string
	status StoreStatus
}

// StatusNext makes the next send (plain, batch or half) to topic be stored
// as usual but answered with status s instead of SUCCESS, as a SYNC_MASTER
// whose slave is down, or a SYNC_FLUSH broker whose disk is slow, answers;
// "" matches any topic. The client does not retry these answers: for a
// plain send it reports the status, and for a half
// (SendMessageInTransaction) it ends the half with ROLLBACK without calling
// the local-transaction listener. Faults queue in call order. It returns
// an error, and queues nothing, for a status other than FlushDiskTimeout,
// SlaveNotAvailable and FlushSlaveTimeout.
func (b *Broker) StatusNext(topic string, s StoreStatus) error {
	switch s {
	case FlushDiskTimeout, SlaveNotAvailable, FlushSlaveTimeout:
	default:
		return fmt.Errorf("rmqtxtest: StatusNext: %s is not a status of a stored message", s)
	}
	b.lock()
	defer b.unlock()
	b.statusNext = append(b.statusNext, statusFault{topic: topic, status: s})
	return nil
}

// storedCodeLocked is the response code for a message just stored on
// topic: the status of the first StatusNext fault matching topic (taken),
// or SUCCESS.
func (b *Broker) storedCodeLocked(topic string) int {
	for i, f := range b.statusNext {
		if f.topic == "" || f.topic == topic {
			b.statusNext = append(b.statusNext[:i], b.statusNext[i+1:]...)
			return int(f.status)
		}
	}
	return codeSuccess
}

// handleSend stores a plain message, a batch, or a transaction half.
func (b *Broker) handleSend(c *conn, req *command) *command {
	h := parseSendHeader(req)
	b.lock()
	defer b.unlock()
	if b.closed {
		return newResponse(req, codeSystemError, "broker closed", nil)
	}
	if h.group != "" && !strings.HasPrefix(h.group, "CLIENT_INNER_PRODUCER") {
		// The connection can take this group's checks: a real broker learns
		// that only from heartbeats, which rocketmq-client-go sends a second
		// after start and then every 30 s; a test should not wait for them.
		c.groups[h.group] = true
	}
	if takeFault(&b.failSend, h.topic) {
		return newResponse(req, codeSystemError, "rmqtxtest: FailNextSend", nil)
	}
	if h.topic == "" {
		return newResponse(req, codeSystemError, "topic is empty", nil)
	}
	t := b.topicLocked(h.topic, !b.opts.NoAutoCreate)
	if t == nil {
		return newResponse(req, codeTopicNotExist, fmt.Sprintf("topic[%s] not exist, apply first please!", h.topic), nil)
	}
	now := b.clock.UnixMilli()
	born := hostPortOf(c.nc.RemoteAddr())
	mk := func(flag int32, body []byte, props map[string]string) *record {
		return &record{topic: h.topic, queueID: h.queueID, sysFlag: h.sysFlag, flag: flag, bornTimestamp: h.bornTimestamp,
			bornHost: born, storeTimestamp: now, reconsumeTimes: h.reconsumeTimes, body: body, props: props}
	}
	ext := map[string]string{"queueId": strconv.Itoa(h.queueID), "MSG_REGION": "DefaultRegion", "TRACE_ON": "false"}
	if h.batch {
		msgs, err := decodeBatch(req.Body)
		if err != nil {
			return newResponse(req, codeSystemError, err.Error(), nil)
		}
		var ids []string
		for i, m := range msgs {
			r := mk(m.flag, m.body, m.props)
			r.sysFlag &^= sysFlagTxMask
			off := b.publishLocked(r)
			if i == 0 {
				ext["queueOffset"] = strconv.FormatInt(off, 10)
				ext["queueId"] = strconv.Itoa(r.queueID)
			}
			ids = append(ids, offsetMsgID(b.storeHost, r.commitOffset))
		}
		ext["msgId"] = strings.Join(ids, ",")
		return newResponse(req, b.storedCodeLocked(h.topic), "", ext)
	}
	props := parseProperties(h.properties)
	r := mk(h.flag, append([]byte(nil), req.Body...), props)
	if tx, _ := strconv.ParseBool(props["TRAN_MSG"]); tx || h.sysFlag&sysFlagTxMask == sysFlagPrepared {
		hf := b.putHalfLocked(r, h.group)
		ext["msgId"] = offsetMsgID(b.storeHost, hf.rec.commitOffset)
		ext["queueOffset"] = strconv.FormatInt(hf.rec.queueOffset, 10)
		ext["queueId"] = strconv.Itoa(hf.realQueue)
		return newResponse(req, b.storedCodeLocked(h.topic), "", ext)
	}
	off := b.publishLocked(r)
	ext["msgId"] = offsetMsgID(b.storeHost, r.commitOffset)
	ext["queueOffset"] = strconv.FormatInt(off, 10)
	ext["queueId"] = strconv.Itoa(r.queueID)
	return newResponse(req, b.storedCodeLocked(h.topic), "", ext)
}
