package inspect

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/wire"
)

// Broker-side topics an event can sit in besides its own topic.
const (
	HalfTopic    = "RMQ_SYS_TRANS_HALF_TOPIC"   // half messages (re-stored at each check)
	DiscardTopic = "TRANS_CHECK_MAX_TIME_TOPIC" // halves the broker gave up checking
)

// BrokerMessage is one message the broker's key index returned.
type BrokerMessage struct {
	Kind string `json:"kind"` // "message", "half" or "discarded"
	// Broker is the address of the broker whose index returned the message
	// (a cluster has several; halves and discards stay on the broker that
	// stored them).
	Broker         string    `json:"broker,omitempty"`
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
//
// Every master broker of the cluster is asked (GET_BROKER_CLUSTER_INFO,
// code 106), together with the masters of the topic's route
// (GET_ROUTEINFO_BY_TOPIC, code 105): a half message and a discarded half
// stay on the broker that stored them, and a topic's route lists only the
// brokers that serve it now. Brokers, when set, replaces both lookups. A
// broker that does not answer does not hide the others' messages:
// QueryByKey returns what it found together with an error naming the
// broker.
type RemotingLookup struct {
	NameServers []string      // name server addresses (host:port)
	Brokers     []string      // optional: broker addresses; skips the route lookup
	Timeout     time.Duration // per request; default 5s
}

// ErrTopicNotFound is returned when the name server knows no route for a topic.
var ErrTopicNotFound = remoting.ErrTopicNotFound

const (
	uniqueKeyProperty = "UNIQ_KEY"
	realTopicProperty = "REAL_TOPIC"
)

// QueryByKey returns the messages of topic whose keys contain key (the index
// is hashed, so candidates are checked), oldest first, from every broker
// (see RemotingLookup). An ordinary topic the name server does not route
// gives an error wrapping ErrTopicNotFound; the broker-local HalfTopic and
// DiscardTopic are asked of every master regardless.
func (l RemotingLookup) QueryByKey(ctx context.Context, topic, key string, max int) ([]BrokerMessage, error) {
	if max <= 0 {
		max = 32
	}
	addrs, err := l.brokers(ctx, topic)
	if err != nil {
		return nil, err
	}
	var out []BrokerMessage
	var errs []error
	for _, addr := range addrs {
		ms, err := l.queryBroker(ctx, addr, topic, key, max)
		if err != nil {
			errs = append(errs, err)
		}
		out = append(out, ms...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].StoredAt.Equal(out[j].StoredAt) {
			return out[i].StoredAt.Before(out[j].StoredAt)
		}
		return out[i].OffsetMsgID < out[j].OffsetMsgID
	})
	return out, errors.Join(errs...)
}

// queryBroker asks one broker's index.
func (l RemotingLookup) queryBroker(ctx context.Context, addr, topic, key string, max int) ([]BrokerMessage, error) {
	h, body, err := remoting.RoundTrip(ctx, addr, l.Timeout, remoting.ReqQueryMessage, map[string]string{
		"topic": topic, "key": key, "maxNum": strconv.Itoa(max),
		"beginTimestamp": "0", "endTimestamp": strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10),
	})
	if err != nil {
		return nil, fmt.Errorf("inspect: broker %s: %w", addr, err)
	}
	switch h.Code {
	case remoting.ResSuccess:
	case remoting.ResQueryNotFound:
		return nil, nil
	default:
		return nil, fmt.Errorf("inspect: query %s on %s: code %d: %s", topic, addr, h.Code, h.Remark)
	}
	var out []BrokerMessage
	for _, m := range broker.DecodeMessages(body) {
		if !hasKey(m, key) {
			continue
		}
		b := brokerMessage(m)
		b.Broker = addr
		out = append(out, b)
	}
	return out, nil
}

func hasKey(m *broker.MessageExt, key string) bool {
	if m.GetProperty(wire.PropEventID) == key || m.GetProperty(uniqueKeyProperty) == key {
		return true
	}
	for _, k := range strings.Fields(m.GetKeys()) {
		if k == key {
			return true
		}
	}
	return false
}

func brokerMessage(m *broker.MessageExt) BrokerMessage {
	b := BrokerMessage{
		Kind: "message", Topic: m.Topic, RealTopic: m.GetProperty(realTopicProperty),
		OffsetMsgID: m.OffsetMsgId, UniqKey: m.GetProperty(uniqueKeyProperty), Keys: m.GetKeys(), Tags: m.GetTags(),
		BornAt: time.UnixMilli(m.BornTimestamp).UTC(), StoredAt: time.UnixMilli(m.StoreTimestamp).UTC(),
		ReconsumeTimes: int(m.ReconsumeTimes), BodySize: len(m.Body),
		ReplayAuditID: m.GetProperty(wire.PropReplayPrefix + "AUDIT_ID"),
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

// brokers returns the addresses to ask for topic: Brokers when set, else
// every master of the cluster together with the masters of topic's route.
// When the name server has no cluster view, the route alone is used.
func (l RemotingLookup) brokers(ctx context.Context, topic string) ([]string, error) {
	if len(l.Brokers) > 0 {
		return l.Brokers, nil
	}
	ns, err := l.nameServers()
	if err != nil {
		return nil, err
	}
	masters, cerr := remoting.ClusterMasters(ctx, ns, l.Timeout)
	if topic == HalfTopic || topic == DiscardTopic {
		if cerr == nil && len(masters) > 0 {
			return masters, nil
		}
	}
	route, err := remoting.MasterBrokers(ctx, ns, l.Timeout, topic)
	if err != nil {
		return nil, fmt.Errorf("inspect: %w", err)
	}
	return union(masters, route), nil
}

// nameServers returns NameServers, checked.
func (l RemotingLookup) nameServers() ([]string, error) {
	if err := rmqname.NameServers(l.NameServers); err != nil {
		return nil, fmt.Errorf("%w: RemotingLookup.NameServers %w", ErrConfig, err)
	}
	return l.NameServers, nil
}

// union returns the distinct addresses of a and b, sorted.
func union(a, b []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range append(append([]string{}, a...), b...) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return out
}
