package rmqlog_test

import (
	"testing"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/require"
)

// The client's log lines keep a message's traceparent (random ids, useful
// to find the trace of a logged message) and redact its tracestate, which
// vendors and applications fill with free text.
func TestScrubKeepsTraceparentRedactsTracestate(t *testing.T) {
	_, hook := capture(t)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	m := message("orders")
	m.WithProperty("traceparent", tp)
	m.WithProperty("tracestate", "acme=user-"+card)
	rlog.Warning("send failed", map[string]interface{}{"message": m})

	entries := hook.AllEntries()
	require.Len(t, entries, 1)
	requireNoCard(t, entries)
	require.Contains(t, rendered(t, entries[0]), "traceparent="+tp)
	require.NotContains(t, rendered(t, entries[0]), "acme=")
}
