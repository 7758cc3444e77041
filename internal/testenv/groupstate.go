package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// DescribeGroup renders what the shared broker knows of a consumer group on
// topic, for a failure report: the consumer ids it allocates queues by, and
// each queue's committed offset against its end. A redelivery that never
// comes is either a queue that no live consumer holds or an offset already
// past the message; this tells which.
func DescribeGroup(t testing.TB, topic, group string, queues int) string {
	t.Helper()
	return DescribeGroupOn(t, Load().Broker, topic, group, queues)
}

// DescribeGroupOn is DescribeGroup for the broker at addr (a suite's
// private one), over its first queues queues of topic.
func DescribeGroupOn(t testing.TB, addr, topic, group string, queues int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	var b strings.Builder
	ids, err := remoting.ConsumerIDs(ctx, addr, 5*time.Second, group)
	fmt.Fprintf(&b, "broker %s: group %s consumers %v (err %v)", addr, group, ids, err)
	for q := 0; q < queues; q++ {
		off, found, oerr := remoting.ConsumerOffset(ctx, addr, 5*time.Second, group, topic, q)
		end, merr := remoting.MaxOffset(ctx, addr, 5*time.Second, topic, q)
		fmt.Fprintf(&b, "; queue %d: committed %d (found %t, err %v), end %d (err %v)", q, off, found, oerr, end, merr)
	}
	return b.String()
}

// AwaitGroupEmpty waits until the shared broker counts no consumer of group,
// and logs how long that took: a crash test calls it after killing the
// group's only consumer and before starting its successor. The broker
// usually drops a killed consumer when its connection closes, but a
// heartbeat of the dead process that it handles after the close registers
// the instance again, and then only the broker's expiry scan removes it
// (channelExpiredTimeout, 120 s, scanned every 10 s). Until then the
// successor shares the queues with the dead instance, and the messages of
// the dead instance's queues wait for the scan.
func AwaitGroupEmpty(t testing.TB, group string, timeout time.Duration) {
	t.Helper()
	AwaitGroupEmptyOn(t, []string{Load().Broker}, group, timeout)
}

// AwaitGroupEmptyOn is AwaitGroupEmpty on the brokers at addrs (a suite's
// private ones), every one of which must count no consumer of group. It
// returns how long the wait took.
func AwaitGroupEmptyOn(t testing.TB, addrs []string, group string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var ids []string
	var addr string
	var err error
	if !Await(timeout, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, addr = range addrs {
			if ids, err = remoting.ConsumerIDs(ctx, addr, 5*time.Second, group); err != nil || len(ids) > 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("testenv: the broker at %s still counts consumers %v of group %s after %s (err %v)", addr, ids, group, timeout, err)
	}
	took := time.Since(start)
	t.Logf("the brokers count no consumer of group %s any more, %s after the wait began", group, took.Round(10*time.Millisecond))
	return took
}
