package txproducer_test

import (
	"fmt"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/txproducer"
)

// TestPanicErrorScrubsValue: the text of a local transaction's panic (which
// Send returns inside ErrLocalTx and which reaches the caller's logs and
// the span) shows no payload the panic value holds: a message, its body,
// its properties, or an error that formats the message. The value itself
// stays the caller's, unchanged.
func TestPanicErrorScrubsValue(t *testing.T) {
	t.Parallel()
	const card, street = "4111111111111111", "Secret Lane 7"
	m := primitive.NewMessage("orders", []byte(`{"card":"`+card+`"}`))
	m.WithProperty("address", street)
	for name, v := range map[string]any{
		"message":    m,
		"body":       m.Body,
		"properties": m.GetProperties(),
		"error":      fmt.Errorf("cannot handle %v", m),
	} {
		e := &txproducer.PanicError{Value: v}
		require.Contains(t, e.Error(), "txproducer: local transaction panicked: ", name)
		require.NotContains(t, e.Error(), card, name)
		require.NotContains(t, e.Error(), street, name)
		require.NotContains(t, e.Error(), fmt.Sprint(m.Body), name)
		require.Equal(t, v, e.Value, name)
	}
	require.Equal(t, "txproducer: local transaction panicked: plain text", (&txproducer.PanicError{Value: "plain text"}).Error())
}
