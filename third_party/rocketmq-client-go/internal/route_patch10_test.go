package internal

import (
	"sync"
	"testing"
)

// rmqtx patch 10: cleanOfflineBroker removes an offline broker's address
// while readers look the broker up without lockNamesrv. It must not change
// a BrokerData a reader may hold. Under -race, the in-place delete it used
// to do is reported here on every run; rmqtx's cluster suite met it in a
// push consumer's pull (FindBrokerAddressInSubscribe) after a broker kill.
func TestCleanOfflineBrokerLeavesReadersAlone(t *testing.T) {
	s := &namesrvs{brokerVersionMap: map[string]map[string]int32{}, brokerLock: new(sync.RWMutex)}
	// broker-b's slave is still in a route, its master (killed) no longer.
	held := &BrokerData{Cluster: "c", BrokerName: "broker-b", BrokerAddresses: map[int64]string{0: "127.0.0.1:1", 1: "127.0.0.1:2"}}
	s.brokerAddressesMap.Store("broker-b", held)
	s.routeDataMap.Store("topic", &TopicRouteData{BrokerDataList: []*BrokerData{
		{Cluster: "c", BrokerName: "broker-b", BrokerAddresses: map[int64]string{1: "127.0.0.1:2"}},
	}})
	// The only other broker name: gone from every route.
	s.brokerAddressesMap.Store("broker-c", &BrokerData{Cluster: "c", BrokerName: "broker-c", BrokerAddresses: map[int64]string{0: "127.0.0.1:3"}})

	var wg sync.WaitGroup
	start := make(chan struct{})
	wg.Add(2)
	go func() {
		defer wg.Done()
		<-start
		for i := 0; i < 1000; i++ {
			_ = s.FindBrokerAddressInSubscribe("broker-b", 0, false)
			_ = s.FindBrokerAddrByName("broker-b")
			for range held.BrokerAddresses {
			}
		}
	}()
	go func() {
		defer wg.Done()
		<-start
		s.cleanOfflineBroker()
	}()
	close(start)
	wg.Wait()

	if len(held.BrokerAddresses) != 2 {
		t.Fatalf("the BrokerData a reader held was changed: %v", held.BrokerAddresses)
	}
	v, ok := s.brokerAddressesMap.Load("broker-b")
	if !ok {
		t.Fatal("broker-b, still in a route, was removed")
	}
	if got := v.(*BrokerData).BrokerAddresses; len(got) != 1 || got[1] != "127.0.0.1:2" {
		t.Fatalf("broker-b's addresses after the clean: %v, want only the slave 127.0.0.1:2", got)
	}
	if r := s.FindBrokerAddressInSubscribe("broker-b", 0, true); r != nil {
		t.Fatalf("the offline master is still found: %+v", r)
	}
	if _, ok := s.brokerAddressesMap.Load("broker-c"); ok {
		t.Fatal("broker-c, in no route, was kept")
	}
}
