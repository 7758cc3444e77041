package checkback_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rmqtx/rmqtx/checkback"
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

// A check answer is a span in the trace of the Send whose half message it
// checks, with the decision and reason; a probe is not traced.
func TestCheckSpanJoinsTheSendTrace(t *testing.T) {
	t.Parallel()
	rec, tp := spanRecorder(t)
	log := newFakeLog()
	body := []byte(`{"card":"4111111111111111"}`)
	log.rows["c"] = committedRow("c", "orders", body)
	c, err := checkback.New(checkback.Config{Log: log, Group: "g", TracerProvider: tp})
	require.NoError(t, err)

	m := discarded("g", "c", body)
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
	r := recovery(t, log, pub, func(c *checkback.RecoveryConfig) { c.TracerProvider = tp })
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
