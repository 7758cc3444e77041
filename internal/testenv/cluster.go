package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// Masters returns the addresses of every master broker of the test
// cluster, as the name server lists them (one on the single-broker bed, two
// with scripts/services.sh RMQTX_BROKERS=2).
func Masters(t testing.TB) []string {
	t.Helper()
	s := Integration(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	m, err := remoting.ClusterMasters(ctx, []string{s.NameServer}, 5*time.Second)
	if err != nil || len(m) == 0 {
		t.Fatalf("testenv: master brokers of the cluster: %v (%d found)", err, len(m))
	}
	return m
}

// CreateClusterTopic creates topic with queues read and write queues (4
// when queues <= 0) on every master broker of the cluster, and waits until
// the name server routes it on all of them. It returns the route, sorted by
// broker name.
func CreateClusterTopic(t testing.TB, topic string, queues int) []remoting.RouteBroker {
	t.Helper()
	s := Integration(t)
	if queues <= 0 {
		queues = 4
	}
	masters := Masters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, addr := range masters {
		if err := remoting.CreateTopic(ctx, addr, 5*time.Second, topic, queues); err != nil {
			t.Fatalf("testenv: create topic %s on %s: %v", topic, addr, err)
		}
	}
	for {
		route, err := remoting.TopicRoute(ctx, []string{s.NameServer}, 5*time.Second, topic)
		if err == nil && len(route) == len(masters) {
			ok := true
			for _, b := range route {
				ok = ok && b.WriteQueues >= queues
			}
			if ok {
				return route
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("testenv: topic %s not routed on all %d masters: %v (route %v)", topic, len(masters), err, route)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
