package remoting

import (
	"testing"
)

// The name server writes its route JSON with unquoted integer map keys
// (fastjson); this body was captured from a two-broker 5.3.3 cluster.
func TestParseRoute(t *testing.T) {
	body := []byte(`{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:31011"},"brokerName":"broker-b","cluster":"DefaultCluster","enableActingMaster":false},` +
		`{"brokerAddrs":{0:"127.0.0.1:30911",1:"127.0.0.1:30921"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false},` +
		`{"brokerAddrs":{1:"127.0.0.1:40921"},"brokerName":"broker-c","cluster":"DefaultCluster"}],"filterServerTable":{},` +
		`"queueDatas":[{"brokerName":"broker-b","perm":7,"readQueueNums":8,"topicSysFlag":0,"writeQueueNums":8},` +
		`{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":2},` +
		`{"brokerName":"broker-c","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}`)
	got, err := ParseRoute(body)
	if err != nil {
		t.Fatal(err)
	}
	want := []RouteBroker{
		{Name: "broker-a", Addr: "127.0.0.1:30911", ReadQueues: 4, WriteQueues: 2, Perm: 6},
		{Name: "broker-b", Addr: "127.0.0.1:31011", ReadQueues: 8, WriteQueues: 8, Perm: 7},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v (broker-c has no master)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %+v, want %+v", got[i], want[i])
		}
	}
	if _, err := ParseRoute([]byte("not json")); err == nil {
		t.Fatal("a broken body is an error")
	}
}
