package remoting

import "testing"

// The name server's cluster list, in its fastjson form (unquoted integer
// keys): two clusters, a broker with a slave, and one with no master.
func TestParseClusterInfo(t *testing.T) {
	body := []byte(`{"brokerAddrTable":{"broker-b":{"brokerAddrs":{0:"127.0.0.1:31011"},"brokerName":"broker-b","cluster":"DefaultCluster","enableActingMaster":false},` +
		`"broker-a":{"brokerAddrs":{0:"127.0.0.1:30911",1:"127.0.0.1:30921"},"brokerName":"broker-a","cluster":"DefaultCluster"},` +
		`"broker-x":{"brokerAddrs":{0:"10.0.0.1:10911"},"brokerName":"broker-x","cluster":"Other"},` +
		`"broker-c":{"brokerAddrs":{1:"127.0.0.1:40921"},"brokerName":"broker-c","cluster":"DefaultCluster"}},` +
		`"clusterAddrTable":{"DefaultCluster":["broker-a","broker-b","broker-c"],"Other":["broker-x"]}}`)
	got, err := ParseClusterInfo(body)
	if err != nil {
		t.Fatal(err)
	}
	want := []ClusterBroker{
		{Cluster: "DefaultCluster", Name: "broker-a", Addr: "127.0.0.1:30911"},
		{Cluster: "DefaultCluster", Name: "broker-b", Addr: "127.0.0.1:31011"},
		{Cluster: "Other", Name: "broker-x", Addr: "10.0.0.1:10911"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v (broker-c has no master)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %+v, want %+v", got[i], want[i])
		}
	}
	if _, err := ParseClusterInfo([]byte("not json")); err == nil {
		t.Fatal("a broken body is an error")
	}
}
