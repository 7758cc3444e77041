package remoting

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// ClusterBroker is one master broker of a cluster, as the name server's
// cluster list (GET_BROKER_CLUSTER_INFO) names it.
type ClusterBroker struct {
	Cluster string
	Name    string // brokerName
	Addr    string // master address
}

type clusterJSON struct {
	BrokerAddrTable map[string]struct {
		BrokerName  string            `json:"brokerName"`
		Cluster     string            `json:"cluster"`
		BrokerAddrs map[string]string `json:"brokerAddrs"`
	} `json:"brokerAddrTable"`
}

// ParseClusterInfo reads a GET_BROKER_CLUSTER_INFO answer into its master
// brokers, sorted by cluster and name. A broker without a master is left
// out.
func ParseClusterInfo(body []byte) ([]ClusterBroker, error) {
	var c clusterJSON
	if err := decodeJSON(body, &c); err != nil {
		return nil, fmt.Errorf("remoting: decode cluster info: %w", err)
	}
	var out []ClusterBroker
	for name, b := range c.BrokerAddrTable {
		if b.BrokerName != "" {
			name = b.BrokerName
		}
		if a := b.BrokerAddrs["0"]; a != "" {
			out = append(out, ClusterBroker{Cluster: b.Cluster, Name: name, Addr: a})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Cluster != out[j].Cluster {
			return out[i].Cluster < out[j].Cluster
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// ClusterBrokers returns the master brokers the first answering name server
// lists, with their cluster, sorted by cluster and name.
func ClusterBrokers(ctx context.Context, nameServers []string, timeout time.Duration) ([]ClusterBroker, error) {
	var lastErr error
	for _, ns := range nameServers {
		h, body, err := RoundTrip(ctx, ns, timeout, ReqGetBrokerClusterInfo, nil)
		if err != nil {
			lastErr = err
			continue
		}
		if h.Code != ResSuccess {
			lastErr = fmt.Errorf("remoting: cluster info from %s: code %d: %s", ns, h.Code, h.Remark)
			continue
		}
		return ParseClusterInfo(body)
	}
	if lastErr == nil {
		lastErr = errors.New("remoting: no name server configured")
	}
	return nil, lastErr
}

// ErrNoSuchCluster is returned by CreateClusterTopic for a cluster the name
// server does not list, or when it lists several and none was named.
var ErrNoSuchCluster = errors.New("remoting: cluster not found")

// CreateClusterTopic creates (or updates) topic with queues read and write
// queues on every master broker of cluster, as `mqadmin updateTopic -c`
// does, and returns those brokers. An empty cluster means the only cluster
// the name server lists. It returns once every broker accepted; the name
// server routes the topic after the brokers' next registration (they
// register a new topic at once), which WaitRouted waits for.
func CreateClusterTopic(ctx context.Context, nameServers []string, timeout time.Duration, cluster, topic string, queues int) ([]ClusterBroker, error) {
	all, err := ClusterBrokers(ctx, nameServers, timeout)
	if err != nil {
		return nil, err
	}
	clusters := map[string]bool{}
	for _, b := range all {
		clusters[b.Cluster] = true
	}
	if cluster == "" {
		if len(clusters) != 1 {
			return nil, fmt.Errorf("%w: the name server lists %d clusters (%s): name one", ErrNoSuchCluster, len(clusters), names(clusters))
		}
		cluster = all[0].Cluster
	}
	var masters []ClusterBroker
	for _, b := range all {
		if b.Cluster == cluster {
			masters = append(masters, b)
		}
	}
	if len(masters) == 0 {
		return nil, fmt.Errorf("%w: %q has no master broker on the name server (clusters: %s)", ErrNoSuchCluster, cluster, names(clusters))
	}
	for _, b := range masters {
		if err := CreateTopic(ctx, b.Addr, timeout, topic, queues); err != nil {
			return nil, fmt.Errorf("remoting: create topic %s on %s (%s): %w", topic, b.Name, b.Addr, err)
		}
	}
	return masters, nil
}

// WaitRouted polls the name server (every 200 ms) until it routes topic to
// every broker of brokers with at least queues write queues, or ctx ends.
func WaitRouted(ctx context.Context, nameServers []string, timeout time.Duration, topic string, brokers []ClusterBroker, queues int) ([]RouteBroker, error) {
	for {
		route, err := TopicRoute(ctx, nameServers, timeout, topic)
		if err == nil && routesAll(route, brokers, queues) {
			return route, nil
		}
		if err == nil {
			err = fmt.Errorf("remoting: the name server routes %s to %d of %d brokers", topic, len(route), len(brokers))
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return route, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

func routesAll(route []RouteBroker, brokers []ClusterBroker, queues int) bool {
	for _, b := range brokers {
		ok := false
		for _, r := range route {
			ok = ok || (r.Name == b.Name && r.WriteQueues >= queues)
		}
		if !ok {
			return false
		}
	}
	return true
}

func names(set map[string]bool) string {
	var out []string
	for n := range set {
		out = append(out, n)
	}
	sort.Strings(out)
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
