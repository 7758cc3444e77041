package testenv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/remoting"
)

// DescribeGroup renders what the shared broker knows of a consumer group on
// topic, for a failure report: the consumer ids it allocates queues by, and
// each queue's committed offset against its end. A redelivery that never
// comes is either a queue that no live consumer holds or an offset already
// past the message; this tells which.
func DescribeGroup(t testing.TB, topic, group string, queues int) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	addr := Load().Broker
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
