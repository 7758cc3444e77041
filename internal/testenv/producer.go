package testenv

import (
	"testing"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/producer"
)

// Producer starts a raw normal producer with its own group and instance
// name on the test broker (name server given explicitly) and shuts it down
// when the test ends. Tests use it to publish messages rmqtx did not send.
func Producer(t testing.TB) rocketmq.Producer {
	t.Helper()
	s := Integration(t)
	group := Name(t, "pub")
	p, err := rocketmq.NewProducer(
		producer.WithNsResolver(s.NameServerResolver()),
		producer.WithGroupName(group),
		producer.WithInstanceName(group),
		producer.WithRetry(2),
	)
	if err != nil {
		t.Fatalf("testenv: producer: %v", err)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("testenv: producer start: %v", err)
	}
	t.Cleanup(func() { _ = p.Shutdown() })
	return p
}
