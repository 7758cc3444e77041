package inspect

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/internal/envelope"
)

// Broker-side topics an event can sit in besides its own topic.
const (
	HalfTopic    = "RMQ_SYS_TRANS_HALF_TOPIC"   // half messages (re-stored at each check)
	DiscardTopic = "TRANS_CHECK_MAX_TIME_TOPIC" // halves the broker gave up checking
)

// BrokerMessage is one message the broker's key index returned.
type BrokerMessage struct {
	Kind           string    `json:"kind"` // "message", "half" or "discarded"
	Topic          string    `json:"topic"`
	RealTopic      string    `json:"real_topic,omitempty"` // for half/discarded messages
	QueueID        int       `json:"queue_id"`
	QueueOffset    int64     `json:"queue_offset"`
	OffsetMsgID    string    `json:"offset_msg_id"`
	UniqKey        string    `json:"uniq_key"`
	Keys           string    `json:"keys"`
	Tags           string    `json:"tags,omitempty"`
	BornAt         time.Time `json:"born_at"`
	StoredAt       time.Time `json:"stored_at"`
	ReconsumeTimes int       `json:"reconsume_times"`
	BodySize       int       `json:"body_size"`
	// ReplayAuditID is the replay_audit id for a replayed message ("" when
	// the message is not a replay).
	ReplayAuditID string `json:"replay_audit_id,omitempty"`
}

// BrokerLookup finds messages in the broker by key (the event id is always
// one of an rmqtx message's keys).
type BrokerLookup interface {
	QueryByKey(ctx context.Context, topic, key string, max int) ([]BrokerMessage, error)
}

// RemotingLookup queries the broker's message index directly over the
// RocketMQ remoting protocol (QUERY_MESSAGE, request code 12), the call
// behind mqadmin queryMsgByKey: the Go client has no public API for it.
// Broker addresses come from the name server's route of the topic
// (GET_ROUTEINFO_BY_TOPIC, code 105), or from Brokers when set.
type RemotingLookup struct {
	NameServer []string      // name server addresses (host:port)
	Brokers    []string      // optional: broker addresses; skips the route lookup
	Timeout    time.Duration // per request; default 5s
}

// ErrTopicNotFound is returned when the name server knows no route for a topic.
var ErrTopicNotFound = errors.New("inspect: topic not found on the name server")

const (
	reqQueryMessage   = 12
	reqGetRouteInfo   = 105
	resSuccess        = 0
	resTopicNotExist  = 17
	resQueryNotFound  = 22
	maxFrame          = 64 << 20
	remotingVersion   = 317
	uniqueKeyProperty = "UNIQ_KEY"
	realTopicProperty = "REAL_TOPIC"
)

var opaqueSeq atomic.Int32

type remotingHeader struct {
	Code      int               `json:"code"`
	Language  string            `json:"language"`
	Version   int               `json:"version"`
	Opaque    int32             `json:"opaque"`
	Flag      int               `json:"flag"`
	Remark    string            `json:"remark"`
	ExtFields map[string]string `json:"extFields"`
}

// roundTrip sends one request on a fresh connection and reads its response.
func (l RemotingLookup) roundTrip(ctx context.Context, addr string, code int, ext map[string]string) (remotingHeader, []byte, error) {
	timeout := l.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return remotingHeader{}, nil, fmt.Errorf("inspect: dial %s: %w", addr, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	h := remotingHeader{Code: code, Language: "GO", Version: remotingVersion, Opaque: opaqueSeq.Add(1), ExtFields: ext}
	hb, err := json.Marshal(h)
	if err != nil {
		return remotingHeader{}, nil, fmt.Errorf("inspect: encode: %w", err)
	}
	frame := make([]byte, 8+len(hb))
	binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(hb)))
	binary.BigEndian.PutUint32(frame[4:8], uint32(len(hb))&0xFFFFFF) // serialize type 0: JSON
	copy(frame[8:], hb)
	if _, err := conn.Write(frame); err != nil {
		return remotingHeader{}, nil, fmt.Errorf("inspect: write to %s: %w", addr, err)
	}
	r := bufio.NewReader(conn)
	var lenBuf [4]byte
	if _, err := io.ReadFull(r, lenBuf[:]); err != nil {
		return remotingHeader{}, nil, fmt.Errorf("inspect: read from %s: %w", addr, err)
	}
	n := binary.BigEndian.Uint32(lenBuf[:])
	if n < 4 || n > maxFrame {
		return remotingHeader{}, nil, fmt.Errorf("inspect: bad frame length %d from %s", n, addr)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return remotingHeader{}, nil, fmt.Errorf("inspect: read from %s: %w", addr, err)
	}
	mark := binary.BigEndian.Uint32(buf[0:4])
	if mark>>24 != 0 {
		return remotingHeader{}, nil, fmt.Errorf("inspect: %s answered in serialize type %d, want JSON", addr, mark>>24)
	}
	hl := int(mark & 0xFFFFFF)
	if 4+hl > len(buf) {
		return remotingHeader{}, nil, fmt.Errorf("inspect: bad header length %d from %s", hl, addr)
	}
	var resp remotingHeader
	if err := json.Unmarshal(buf[4:4+hl], &resp); err != nil {
		return remotingHeader{}, nil, fmt.Errorf("inspect: decode header from %s: %w", addr, err)
	}
	return resp, buf[4+hl:], nil
}

var brokerAddrsRE = regexp.MustCompile(`"brokerAddrs"\s*:\s*\{([^}]*)\}`)
var addrEntryRE = regexp.MustCompile(`"?(\d+)"?\s*:\s*"([^"]+)"`)

// brokers returns the master broker addresses serving topic.
func (l RemotingLookup) brokers(ctx context.Context, topic string) ([]string, error) {
	if len(l.Brokers) > 0 {
		return l.Brokers, nil
	}
	var lastErr error
	for _, ns := range l.NameServer {
		h, body, err := l.roundTrip(ctx, ns, reqGetRouteInfo, map[string]string{"topic": topic})
		if err != nil {
			lastErr = err
			continue
		}
		if h.Code == resTopicNotExist {
			return nil, fmt.Errorf("%w: %s", ErrTopicNotFound, topic)
		}
		if h.Code != resSuccess {
			lastErr = fmt.Errorf("inspect: route of %s: code %d: %s", topic, h.Code, h.Remark)
			continue
		}
		var out []string
		for _, m := range brokerAddrsRE.FindAllSubmatch(body, -1) {
			for _, e := range addrEntryRE.FindAllSubmatch(m[1], -1) {
				if string(e[1]) == "0" { // master
					out = append(out, string(e[2]))
				}
			}
		}
		sort.Strings(out)
		return out, nil
	}
	if lastErr == nil {
		lastErr = errors.New("inspect: no name server configured")
	}
	return nil, lastErr
}

// QueryByKey returns the messages of topic whose keys contain key (the index
// is hashed, so candidates are checked), oldest first.
func (l RemotingLookup) QueryByKey(ctx context.Context, topic, key string, max int) ([]BrokerMessage, error) {
	if max <= 0 {
		max = 32
	}
	addrs, err := l.brokers(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []BrokerMessage
	for _, addr := range addrs {
		h, body, err := l.roundTrip(ctx, addr, reqQueryMessage, map[string]string{
			"topic": topic, "key": key, "maxNum": strconv.Itoa(max),
			"beginTimestamp": "0", "endTimestamp": strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10),
		})
		if err != nil {
			return out, err
		}
		switch h.Code {
		case resSuccess:
		case resQueryNotFound:
			continue
		default:
			return out, fmt.Errorf("inspect: query %s on %s: code %d: %s", topic, addr, h.Code, h.Remark)
		}
		for _, m := range primitive.DecodeMessage(body) {
			if !hasKey(m, key) {
				continue
			}
			out = append(out, brokerMessage(m))
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].StoredAt.Equal(out[j].StoredAt) {
			return out[i].StoredAt.Before(out[j].StoredAt)
		}
		return out[i].OffsetMsgID < out[j].OffsetMsgID
	})
	return out, nil
}

func hasKey(m *primitive.MessageExt, key string) bool {
	if m.GetProperty(envelope.PropEventID) == key || m.GetProperty(uniqueKeyProperty) == key {
		return true
	}
	for _, k := range strings.Fields(m.GetKeys()) {
		if k == key {
			return true
		}
	}
	return false
}

func brokerMessage(m *primitive.MessageExt) BrokerMessage {
	b := BrokerMessage{
		Kind: "message", Topic: m.Topic, RealTopic: m.GetProperty(realTopicProperty),
		OffsetMsgID: m.OffsetMsgId, UniqKey: m.GetProperty(uniqueKeyProperty), Keys: m.GetKeys(), Tags: m.GetTags(),
		BornAt: time.UnixMilli(m.BornTimestamp).UTC(), StoredAt: time.UnixMilli(m.StoreTimestamp).UTC(),
		ReconsumeTimes: int(m.ReconsumeTimes), BodySize: len(m.Body),
		ReplayAuditID: m.GetProperty(envelope.PropReplayPrefix + "AUDIT_ID"),
	}
	if m.Queue != nil {
		b.QueueID = m.Queue.QueueId
	}
	b.QueueOffset = m.QueueOffset
	switch m.Topic {
	case HalfTopic:
		b.Kind = "half"
	case DiscardTopic:
		b.Kind = "discarded"
	}
	return b
}
