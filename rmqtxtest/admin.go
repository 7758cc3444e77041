package rmqtxtest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Client registration (heartbeats), the broker's settings, topic creation
// and Restart.

// client is a client instance (one rocketmq-client-go client id) as its
// heartbeats registered it.
type client struct {
	id        string
	conn      *conn // nil after Restart until its next heartbeat
	producers map[string]bool
	consumers map[string]consumerReg
}

// consumerReg is a consumer group's subscription: topic -> expression.
type consumerReg struct {
	subs map[string]string
}

type heartbeatJSON struct {
	ClientID  string `json:"clientID"`
	Producers []struct {
		GroupName string `json:"groupName"`
	} `json:"producerDataSet"`
	Consumers []struct {
		GroupName string `json:"groupName"`
		Subs      []struct {
			Topic     string `json:"topic"`
			SubString string `json:"subString"`
		} `json:"subscriptionDataSet"`
	} `json:"consumerDataSet"`
}

func (b *Broker) handleHeartbeat(c *conn, req *command) *command {
	var hb heartbeatJSON
	if err := json.Unmarshal(req.Body, &hb); err != nil || hb.ClientID == "" {
		return newResponse(req, codeSystemError, "bad heartbeat", nil)
	}
	b.lock()
	defer b.unlock()
	cl := &client{id: hb.ClientID, conn: c, producers: map[string]bool{}, consumers: map[string]consumerReg{}}
	old := b.clients[hb.ClientID]
	c.clientID = hb.ClientID
	for _, p := range hb.Producers {
		if !strings.HasPrefix(p.GroupName, "CLIENT_INNER_PRODUCER") {
			cl.producers[p.GroupName] = true
			c.groups[p.GroupName] = true
		}
	}
	changed := map[string]bool{}
	for _, cd := range hb.Consumers {
		reg := consumerReg{subs: map[string]string{}}
		for _, s := range cd.Subs {
			reg.subs[s.Topic] = s.SubString
			if strings.HasPrefix(s.Topic, retryPrefix) {
				b.topicLocked(s.Topic, false) // the broker creates the retry topic on heartbeat
			}
		}
		cl.consumers[cd.GroupName] = reg
		if old == nil || old.conn != c {
			changed[cd.GroupName] = true
		} else if _, ok := old.consumers[cd.GroupName]; !ok {
			changed[cd.GroupName] = true
		}
	}
	if old != nil {
		for g := range old.consumers {
			if _, ok := cl.consumers[g]; !ok {
				changed[g] = true
			}
		}
	}
	b.clients[hb.ClientID] = cl
	for g := range changed {
		b.notifyGroupLocked(g, c)
	}
	b.broadcastLocked()
	return newResponse(req, codeSuccess, "", nil)
}

// notifyGroupLocked tells the group's consumers, except the one on skip,
// that its membership changed (NOTIFY_CONSUMER_IDS_CHANGED), so they
// rebalance at once instead of at their next 20 s rebalance.
func (b *Broker) notifyGroupLocked(group string, skip *conn) {
	for _, cl := range b.clients {
		if _, ok := cl.consumers[group]; !ok || cl.conn == nil || cl.conn == skip {
			continue
		}
		b.sendLocked(cl.conn, &command{Code: reqNotifyConsumerIDs, Language: "JAVA", Version: remotingVersion,
			Opaque: nextOpaque(), Flag: flagOneway, ExtFields: map[string]string{"consumerGroup": group}})
	}
}

// handleUnregister forgets a client's producer or consumer group.
func (b *Broker) handleUnregister(c *conn, req *command) *command {
	id := req.ext("clientID")
	b.lock()
	defer b.unlock()
	if cl := b.clients[id]; cl != nil {
		if g := req.ext("producerGroup"); g != "" {
			delete(cl.producers, g)
			delete(c.groups, g)
		}
		if g := req.ext("consumerGroup"); g != "" {
			if _, ok := cl.consumers[g]; ok {
				delete(cl.consumers, g)
				b.notifyGroupLocked(g, c)
			}
		}
	}
	b.broadcastLocked()
	return newResponse(req, codeSuccess, "", nil)
}

func (b *Broker) handleConsumerList(req *command) *command {
	group := req.ext("consumerGroup")
	b.lock()
	ids := b.consumerIDsLocked(group)
	b.unlock()
	if len(ids) == 0 {
		return newResponse(req, codeSystemError, "no consumer for this group, "+group, nil)
	}
	body, err := json.Marshal(map[string][]string{"consumerIdList": ids})
	if err != nil {
		return newResponse(req, codeSystemError, err.Error(), nil)
	}
	resp := newResponse(req, codeSuccess, "", nil)
	resp.Body = body
	return resp
}

func (b *Broker) consumerIDsLocked(group string) []string {
	var ids []string
	for id, cl := range b.clients {
		if _, ok := cl.consumers[group]; ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// handleProducerConnections lists the client ids of group's producers
// registered by heartbeat and connected.
func (b *Broker) handleProducerConnections(req *command) *command {
	group := req.ext("producerGroup")
	type connJSON struct {
		ClientID   string `json:"clientId"`
		ClientAddr string `json:"clientAddr"`
		Language   string `json:"language"`
		Version    int    `json:"version"`
	}
	var set []connJSON
	b.lock()
	for _, cl := range b.clients {
		if cl.producers[group] && cl.conn != nil {
			set = append(set, connJSON{ClientID: cl.id, ClientAddr: cl.conn.nc.RemoteAddr().String(), Language: "GO", Version: remotingVersion})
		}
	}
	b.unlock()
	if len(set) == 0 {
		return newResponse(req, codeSystemError, fmt.Sprintf("the producer group[%s] not exist", group), nil)
	}
	sort.Slice(set, func(i, j int) bool { return set[i].ClientID < set[j].ClientID })
	body, err := json.Marshal(map[string]any{"connectionSet": set})
	if err != nil {
		return newResponse(req, codeSystemError, err.Error(), nil)
	}
	resp := newResponse(req, codeSuccess, "", nil)
	resp.Body = body
	return resp
}

// handleBrokerConfig answers the settings rmqtx's Start checks read
// (GET_BROKER_CONFIG: Java properties text). The check settings mirror
// Options; transactionOpBatchInterval is 0 because the fake records an
// answered half at once, so a check never sees an answered half again.
func (b *Broker) handleBrokerConfig(req *command) *command {
	conf := map[string]string{
		"brokerName":                 BrokerName,
		"brokerClusterName":          ClusterName,
		"brokerId":                   "0",
		"brokerRole":                 "ASYNC_MASTER",
		"autoCreateTopicEnable":      strconv.FormatBool(!b.opts.NoAutoCreate),
		"defaultTopicQueueNums":      strconv.Itoa(b.opts.Queues),
		"transactionTimeOut":         strconv.FormatInt(b.opts.CheckImmunity.Milliseconds(), 10),
		"transactionCheckInterval":   "60000",
		"transactionCheckMax":        strconv.Itoa(b.opts.CheckMax),
		"transactionOpBatchInterval": "0",
		"messageDelayLevel":          "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
		"listenPort":                 strings.TrimPrefix(b.brAddr[strings.LastIndex(b.brAddr, ":"):], ":"),
	}
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		sb.WriteString(k + "=" + conf[k] + "\n")
	}
	resp := newResponse(req, codeSuccess, "", nil)
	resp.Body = []byte(sb.String())
	return resp
}

// handleCreateTopic creates or grows a topic (UPDATE_AND_CREATE_TOPIC, as
// mqadmin updateTopic and rmqtx's topic create send it).
func (b *Broker) handleCreateTopic(req *command) *command {
	name := req.ext("topic")
	if name == "" {
		return newResponse(req, codeSystemError, "topic is empty", nil)
	}
	q := int(req.extInt("writeQueueNums"))
	if r := int(req.extInt("readQueueNums")); r > q {
		q = r
	}
	b.CreateTopic(name, q)
	return newResponse(req, codeSuccess, "", nil)
}

// Restart drops every client connection to the broker and keeps the store,
// offsets and registrations, as a broker restart that its clients'
// heartbeats re-registered with: clients reconnect on their next request.
// Pulls waiting in long polling are failed first (SYSTEM_ERROR), so their
// clients pull again after their error delay (3 s) on a new connection
// instead of waiting for their own 30 s timeout on the dropped one. The
// name server is not restarted.
func (b *Broker) Restart(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rmqtxtest: restart: %w", err)
	}
	b.lock()
	if b.closed {
		b.unlock()
		return ErrClosed
	}
	b.draining = true
	for _, list := range b.parked {
		for _, p := range append([]*parkedPull(nil), list...) {
			if p.timer.Stop() {
				b.wg.Done()
			}
			b.unparkLocked(p)
			b.sendLocked(p.c, newResponse(p.req, codeSystemError, "broker restarting", nil))
		}
	}
	var conns []*conn
	for c := range b.conns {
		if !c.ns {
			c.restart = true
			conns = append(conns, c)
		}
	}
	b.unlock() // writes the failed pulls before the connections close
	for _, c := range conns {
		_ = c.nc.Close()
	}
	b.lock()
	b.draining = false
	b.broadcastLocked()
	b.unlock()
	return nil
}
