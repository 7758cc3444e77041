package remoting

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
)

// ReqGetProducerConnectionList asks a broker which client instances of a
// producer group are registered with it (their heartbeats arrived): the
// channels it can send transaction checks to.
const ReqGetProducerConnectionList = 204

// RouteBroker is one master broker of a topic's route.
type RouteBroker struct {
	Name        string // brokerName, the MessageQueue.BrokerName of its queues
	Addr        string // master address
	ReadQueues  int
	WriteQueues int
	Perm        int
}

// unquotedKeyRE matches the integer map keys the name server writes
// unquoted ({0:"127.0.0.1:10911"}); broker and cluster names never contain
// ',' or '{', so the match cannot start inside a string value.
var unquotedKeyRE = regexp.MustCompile(`([{,])(\d+):`)

// decodeJSON decodes a remoting body into v, quoting its integer map keys
// first (unquotedKeyRE).
func decodeJSON(body []byte, v any) error {
	return json.Unmarshal(unquotedKeyRE.ReplaceAll(body, []byte(`$1"$2":`)), v)
}

type routeJSON struct {
	BrokerDatas []struct {
		BrokerName  string            `json:"brokerName"`
		BrokerAddrs map[string]string `json:"brokerAddrs"`
	} `json:"brokerDatas"`
	QueueDatas []struct {
		BrokerName     string `json:"brokerName"`
		ReadQueueNums  int    `json:"readQueueNums"`
		WriteQueueNums int    `json:"writeQueueNums"`
		Perm           int    `json:"perm"`
	} `json:"queueDatas"`
}

// ParseRoute reads a GET_ROUTEINFO_BY_TOPIC answer into its master
// brokers, sorted by name. A broker without a master or without queue data
// for the topic is left out.
func ParseRoute(body []byte) ([]RouteBroker, error) {
	var r routeJSON
	if err := decodeJSON(body, &r); err != nil {
		return nil, fmt.Errorf("remoting: decode route: %w", err)
	}
	addr := map[string]string{}
	for _, b := range r.BrokerDatas {
		if a := b.BrokerAddrs["0"]; a != "" {
			addr[b.BrokerName] = a
		}
	}
	var out []RouteBroker
	for _, q := range r.QueueDatas {
		a, ok := addr[q.BrokerName]
		if !ok {
			continue
		}
		out = append(out, RouteBroker{Name: q.BrokerName, Addr: a, ReadQueues: q.ReadQueueNums, WriteQueues: q.WriteQueueNums, Perm: q.Perm})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// TopicRoute returns the master brokers serving topic with their queue
// counts, from the first name server that answers. A topic the name server
// does not know gives an error wrapping ErrTopicNotFound.
func TopicRoute(ctx context.Context, nameServers []string, timeout time.Duration, topic string) ([]RouteBroker, error) {
	body, err := routeBody(ctx, nameServers, timeout, topic)
	if err != nil {
		return nil, err
	}
	return ParseRoute(body)
}

// ProducerConnections returns the client ids of group's producer instances
// registered with the broker at addr, sorted; none when the broker knows no
// instance of the group.
func ProducerConnections(ctx context.Context, addr string, timeout time.Duration, group string) ([]string, error) {
	h, body, err := RoundTrip(ctx, addr, timeout, ReqGetProducerConnectionList, map[string]string{"producerGroup": group})
	if err != nil {
		return nil, err
	}
	if h.Code != ResSuccess {
		if strings.Contains(h.Remark, "not exist") {
			return nil, nil
		}
		return nil, fmt.Errorf("remoting: producer connections of %s on %s: code %d: %s", group, addr, h.Code, h.Remark)
	}
	var pc struct {
		ConnectionSet []struct {
			ClientID string `json:"clientId"`
		} `json:"connectionSet"`
	}
	if err := decodeJSON(body, &pc); err != nil {
		return nil, fmt.Errorf("remoting: decode producer connections from %s: %w", addr, err)
	}
	out := make([]string, 0, len(pc.ConnectionSet))
	for _, c := range pc.ConnectionSet {
		out = append(out, c.ClientID)
	}
	sort.Strings(out)
	return out, nil
}
