package remoting

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Request codes for reading the cluster's brokers and a broker's settings.
const (
	ReqGetBrokerConfig      = 26
	ReqGetBrokerClusterInfo = 106
)

// ClusterMasters returns the addresses of all master brokers the first
// answering name server knows (GET_BROKER_CLUSTER_INFO), sorted.
func ClusterMasters(ctx context.Context, nameServers []string, timeout time.Duration) ([]string, error) {
	masters, _, err := ClusterReplicas(ctx, nameServers, timeout)
	return masters, err
}

// ClusterReplicas returns the addresses of all master brokers and of all
// slave brokers (broker id other than 0) the first answering name server
// knows (GET_BROKER_CLUSTER_INFO), each sorted.
func ClusterReplicas(ctx context.Context, nameServers []string, timeout time.Duration) (masters, slaves []string, err error) {
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
		seen := map[string]bool{}
		for _, m := range brokerAddrsRE.FindAllSubmatch(body, -1) {
			for _, e := range addrEntryRE.FindAllSubmatch(m[1], -1) {
				addr := string(e[2])
				if seen[addr] {
					continue
				}
				seen[addr] = true
				if string(e[1]) == "0" {
					masters = append(masters, addr)
				} else {
					slaves = append(slaves, addr)
				}
			}
		}
		sort.Strings(masters)
		sort.Strings(slaves)
		return masters, slaves, nil
	}
	if lastErr == nil {
		lastErr = errors.New("remoting: no name server configured")
	}
	return nil, nil, lastErr
}

// BrokerConfig returns the running configuration of the broker at addr
// (GET_BROKER_CONFIG: a Java properties text, one key=value a line).
func BrokerConfig(ctx context.Context, addr string, timeout time.Duration) (map[string]string, error) {
	h, body, err := RoundTrip(ctx, addr, timeout, ReqGetBrokerConfig, nil)
	if err != nil {
		return nil, err
	}
	if h.Code != ResSuccess {
		return nil, fmt.Errorf("remoting: broker config of %s: code %d: %s", addr, h.Code, h.Remark)
	}
	return ParseProperties(body), nil
}

// ParseProperties reads the key=value lines of a broker's configuration,
// skipping blank lines and # comments.
func ParseProperties(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), maxFrame)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, "="); ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}
