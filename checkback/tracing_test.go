package checkback_test

import (
	"context"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/observe"
)

const sendTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func spanRecorder(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

// A check answer is a span in the trace of the Send whose half message it
// checks, with the decision and reason; a probe is not traced.
func TestCheckSpanJoinsTheSendTrace(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	log := newFakeLog()
	body := []byte(`{"card":"4111111111111111"}`)
	log.rows["c"] = committedRow("c", "orders", "u1", body)
	c, err := checkback.New(checkback.Config{Log: log, Group: "g", Observe: observe.Observe{TracerProvider: tp}})
	require.NoError(t, err)

	m := halfMessage("g", "c", "u1", body)
	m.WithProperty(otelx.PropTraceparent, sendTraceparent)
	a := c.Check(context.Background(), m)
	require.Equal(t, checkback.Commit, a.Decision)
	probe := &primitive.MessageExt{}
	probe.WithProperty(checkback.PropProbe, "1")
	require.Equal(t, checkback.Rollback, c.Check(context.Background(), probe).Decision)

	spans := rec.Ended()
	require.Len(t, spans, 1, "the probe has no span")
	s := spans[0]
	require.Equal(t, otelx.SpanCheck, s.Name())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String())
	got := map[string]string{}
	for _, kv := range s.Attributes() {
		got[string(kv.Key)] = kv.Value.String()
		require.NotContains(t, kv.Value.String(), "4111")
	}
	require.Equal(t, "c", got[string(otelx.AttrEventID)])
	require.Equal(t, "commit", got[string(otelx.AttrOutcome)])
	require.Equal(t, "found", got[string(otelx.AttrReason)])
	require.Equal(t, "g", got[string(otelx.AttrGroup)])
}
