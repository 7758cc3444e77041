package discard_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/txlog"
)

const sendTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func spanRecorder(t *testing.T) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

// A republish is a child of the trace context stored with the txlog row
// (the Send's), and the republished message carries the republish span's
// context. Without a tracer the stored context is passed on unchanged.
func TestRepublishSpan(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	row := func() txlog.Row {
		r := committedRow("c", "orders", body)
		var props map[string]string
		require.NoError(t, json.Unmarshal([]byte(r.Properties), &props))
		props[otelx.PropTraceparent] = sendTraceparent
		b, _ := json.Marshal(props)
		r.Properties = string(b)
		return r
	}

	rec, tp := spanRecorder(t)
	log := newFakeLog()
	log.rows["c"] = row()
	pub := &fakePublisher{}
	r := recovery(t, log, pub, func(c *discard.Config) { c.TracerProvider = tp })
	res, err := r.Handle(context.Background(), discarded("g", "c", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryRepublished, res.Decision)
	var rs sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == otelx.SpanRepublish {
			rs = s
		}
	}
	require.NotNil(t, rs)
	require.Equal(t, "00f067aa0ba902b7", rs.Parent().SpanID().String(), "a child of the Send")
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", rs.SpanContext().TraceID().String())
	require.Len(t, pub.sent, 1)
	require.Equal(t, "00-"+rs.SpanContext().TraceID().String()+"-"+rs.SpanContext().SpanID().String()+"-01",
		pub.sent[0].GetProperty(otelx.PropTraceparent))

	log2 := newFakeLog()
	log2.rows["c"] = row()
	pub2 := &fakePublisher{}
	_, err = recovery(t, log2, pub2).Handle(context.Background(), discarded("g", "c", body))
	require.NoError(t, err)
	require.Equal(t, sendTraceparent, pub2.sent[0].GetProperty(otelx.PropTraceparent), "tracing off: passed on")
}
