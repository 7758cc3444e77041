package rmqtxtest

import (
	"encoding/json"
	"fmt"
)

// The name server knows one broker, and every topic the broker has: a
// topic created on the broker is routed at once (a real broker registers a
// new topic with the name server right away too).

type queueData struct {
	BrokerName     string `json:"brokerName"`
	ReadQueueNums  int    `json:"readQueueNums"`
	WriteQueueNums int    `json:"writeQueueNums"`
	Perm           int    `json:"perm"`
	TopicSysFlag   int    `json:"topicSysFlag"`
}

type brokerData struct {
	Cluster     string            `json:"cluster"`
	BrokerName  string            `json:"brokerName"`
	BrokerAddrs map[string]string `json:"brokerAddrs"`
}

type routeData struct {
	OrderTopicConf string       `json:"orderTopicConf"`
	QueueDatas     []queueData  `json:"queueDatas"`
	BrokerDatas    []brokerData `json:"brokerDatas"`
}

const permReadWrite = 6

func (b *Broker) brokerData() brokerData {
	return brokerData{Cluster: ClusterName, BrokerName: BrokerName, BrokerAddrs: map[string]string{"0": b.brAddr}}
}

func (b *Broker) handleNameServer(_ *conn, req *command) *command {
	switch req.Code {
	case reqGetRouteInfo:
		name := req.ext("topic")
		b.lock()
		// Unknown topics: with auto-create the name server routes the
		// topic with the default queue count (the client would otherwise
		// fall back to TBW102's route and the broker would create the
		// topic on the first send); a consumer can then subscribe before
		// anything was sent, as it can once a producer used the topic.
		t := b.topicLocked(name, !b.opts.NoAutoCreate && name != "")
		var queues int
		if t != nil {
			queues = len(t.queues)
		}
		b.unlock()
		if t == nil {
			return newResponse(req, codeTopicNotExist, fmt.Sprintf("No topic route info in name server for the topic: %s", name), nil)
		}
		body, err := json.Marshal(routeData{
			QueueDatas:  []queueData{{BrokerName: BrokerName, ReadQueueNums: queues, WriteQueueNums: queues, Perm: permReadWrite}},
			BrokerDatas: []brokerData{b.brokerData()},
		})
		if err != nil {
			return newResponse(req, codeSystemError, err.Error(), nil)
		}
		resp := newResponse(req, codeSuccess, "", nil)
		resp.Body = body
		return resp
	case reqGetClusterInfo:
		body, err := json.Marshal(map[string]any{
			"brokerAddrTable":  map[string]brokerData{BrokerName: b.brokerData()},
			"clusterAddrTable": map[string][]string{ClusterName: {BrokerName}},
		})
		if err != nil {
			return newResponse(req, codeSystemError, err.Error(), nil)
		}
		resp := newResponse(req, codeSuccess, "", nil)
		resp.Body = body
		return resp
	}
	return b.unsupported(req)
}
