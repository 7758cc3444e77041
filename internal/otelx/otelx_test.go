package otelx_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/wire"
)

func recorder(t testing.TB) (*tracetest.SpanRecorder, *sdktrace.TracerProvider) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, tp
}

func byName(t testing.TB, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	t.Fatalf("no ended span %q", name)
	return nil
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func props(id string) map[string]string {
	return wire.Envelope{EventID: id, EventType: "OrderPlaced"}.Properties([]byte("card 4111111111111111"))
}

// hooks is what one Send and one consume do with the tracer: the spans and
// the injection and extraction of the trace context.
func hooks(tr *otelx.Tracer, p map[string]string) {
	ctx, send := tr.Start(context.Background(), otelx.SpanSend, trace.SpanKindProducer,
		otelx.Attrs{Destination: "orders", Group: "pg", EventType: "OrderPlaced"})
	tr.Inject(ctx, p)
	_, half := tr.Start(ctx, otelx.SpanHalfSend, trace.SpanKindClient, otelx.Attrs{})
	half.SetMsgID("AC110001")
	half.End("stored", "")
	_, local := tr.Start(ctx, otelx.SpanLocalTx, trace.SpanKindInternal, otelx.Attrs{})
	local.End("committed", "")
	send.SetEvent("evt-1", "OrderPlaced")
	send.End("committed", "")
	_, consume := tr.StartFromProps(context.Background(), p, otelx.SpanConsume, trace.SpanKindConsumer,
		otelx.Attrs{Destination: "orders", Group: "cg", MsgID: "AC110001"})
	consume.SetReason("")
	consume.End("applied", "")
}

// Tracing off (nil TracerProvider) allocates nothing on any hook, and
// writes nothing into the properties.
func TestTracingOffAllocatesNothing(t *testing.T) {
	tr := otelx.New(nil)
	require.Nil(t, tr)
	require.False(t, tr.On())
	p := props("evt-1")
	before := len(p)
	m := primitive.NewMessage("orders", []byte("x"))
	row := `{"tenant":"acme"}`
	n := testing.AllocsPerRun(200, func() {
		hooks(tr, p)
		ctx, sp := tr.StartFromMessage(context.Background(), m, otelx.SpanCheck, trace.SpanKindServer, otelx.Attrs{})
		tr.InjectMessage(ctx, m)
		sp.EndSend(nil, errors.New("x"))
		_, sp = tr.StartLinked(ctx, p, otelx.SpanReplay, trace.SpanKindProducer, otelx.Attrs{})
		sp.End("", "send")
		ctx, sp = tr.StartDispatch(ctx, row, otelx.Attrs{})
		otelx.InjectContext(ctx, m)
		sp.End("sent", "")
		_ = otelx.RowHeaders(ctx, nil)
	})
	require.Zero(t, n, "allocations per Send+consume with tracing off")
	require.Len(t, p, before, "no property written")
	require.Empty(t, m.GetProperty(otelx.PropTraceparent))
}

// The context injected by the send span comes out of the properties as the
// consume span's parent: one trace, correct parent/child links, event id
// and type as attributes, never the payload.
func TestInjectExtractOneTrace(t *testing.T) {
	rec, tp := recorder(t)
	tr := otelx.New(tp)
	p := props("evt-1")
	hooks(tr, p)

	send, half, local, consume := byName(t, rec, otelx.SpanSend), byName(t, rec, otelx.SpanHalfSend),
		byName(t, rec, otelx.SpanLocalTx), byName(t, rec, otelx.SpanConsume)
	require.Regexp(t, `^00-[0-9a-f]{32}-[0-9a-f]{16}-01$`, p[otelx.PropTraceparent])
	require.Equal(t, send.SpanContext().TraceID().String()+"-"+send.SpanContext().SpanID().String(),
		p[otelx.PropTraceparent][3:52], "the property is the send span's context")
	for _, s := range []sdktrace.ReadOnlySpan{half, local, consume} {
		require.Equal(t, send.SpanContext().TraceID(), s.SpanContext().TraceID(), s.Name())
		require.Equal(t, send.SpanContext().SpanID(), s.Parent().SpanID(), s.Name())
	}
	require.True(t, consume.Parent().IsRemote(), "the consume span's parent came off the message")
	require.Equal(t, trace.SpanKindConsumer, consume.SpanKind())
	a := attrs(consume)
	require.Equal(t, "evt-1", a[otelx.AttrEventID].AsString(), "read from the properties")
	require.Equal(t, "OrderPlaced", a[otelx.AttrEventType].AsString())
	require.Equal(t, "rocketmq", a[otelx.AttrSystem].AsString())
	require.Equal(t, "applied", a[otelx.AttrOutcome].AsString())
	require.Equal(t, "evt-1", attrs(send)[otelx.AttrEventID].AsString(), "set after the start")
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			require.NotContains(t, kv.Value.String(), "4111", "%s: %s", s.Name(), kv.Key)
		}
	}
}

// tracestate travels when it fits, is dropped when too long, and a stale
// one is replaced by the new span's (none here).
func TestTracestate(t *testing.T) {
	_, tp := recorder(t)
	tr := otelx.New(tp)
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled,
	})
	ts, err := trace.ParseTraceState("acme=abc")
	require.NoError(t, err)
	ctx, sp := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent.WithTraceState(ts)),
		otelx.SpanSend, trace.SpanKindProducer, otelx.Attrs{})
	defer sp.End("", "")
	p := map[string]string{}
	tr.Inject(ctx, p)
	require.Equal(t, "acme=abc", p[otelx.PropTracestate])

	long, err := trace.ParseTraceState("acme=" + strings.Repeat("x", 250) + ",beta=" + strings.Repeat("y", 250) + ",gamma=" + strings.Repeat("z", 30))
	require.NoError(t, err)
	ctx2, sp2 := tr.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent.WithTraceState(long)),
		otelx.SpanSend, trace.SpanKindProducer, otelx.Attrs{})
	defer sp2.End("", "")
	tr.Inject(ctx2, p)
	require.NotContains(t, p, otelx.PropTracestate, "longer than MaxTracestateLen: not written, and the old one is gone")
	require.Contains(t, p[otelx.PropTraceparent], sp2SpanID(ctx2))

	m := primitive.NewMessage("orders", nil)
	m.WithProperty(otelx.PropTracestate, "stale=1")
	tr.InjectMessage(ctx2, m)
	require.Empty(t, m.GetProperty(otelx.PropTracestate))
	require.Contains(t, m.GetProperty(otelx.PropTraceparent), sp2SpanID(ctx2))
}

func sp2SpanID(ctx context.Context) string {
	return trace.SpanContextFromContext(ctx).SpanID().String()
}

// A message's properties carry the context through StartFromMessage and
// InjectMessage, as the check and the republish use them.
func TestMessageCarrier(t *testing.T) {
	rec, tp := recorder(t)
	tr := otelx.New(tp)
	m := primitive.NewMessage("orders", []byte("x"))
	m.WithProperties(props("evt-9"))
	ctx, send := tr.Start(context.Background(), otelx.SpanSend, trace.SpanKindProducer, otelx.Attrs{})
	tr.InjectMessage(ctx, m)
	send.End("committed", "")

	ctx, check := tr.StartFromMessage(context.Background(), m, otelx.SpanCheck, trace.SpanKindServer, otelx.Attrs{Group: "pg"})
	check.SetReason("found")
	check.End("commit", "")
	tr.InjectMessage(ctx, m)
	c := byName(t, rec, otelx.SpanCheck)
	require.Equal(t, byName(t, rec, otelx.SpanSend).SpanContext().SpanID(), c.Parent().SpanID())
	require.Equal(t, "evt-9", attrs(c)[otelx.AttrEventID].AsString())
	require.Equal(t, "found", attrs(c)[otelx.AttrReason].AsString())
	require.Contains(t, m.GetProperty(otelx.PropTraceparent), c.SpanContext().SpanID().String(), "re-injected: the check's context")

	_, sp := tr.Start(context.Background(), otelx.SpanRepublish, trace.SpanKindProducer, otelx.Attrs{})
	sp.EndSend(&primitive.SendResult{Status: primitive.SendFlushDiskTimeout}, nil)
	r := byName(t, rec, otelx.SpanRepublish)
	require.Equal(t, codes.Error, r.Status().Code)
	require.Equal(t, "send_status", attrs(r)[otelx.AttrErrorType].AsString())
}

// The outbox keeps the caller's span context in the row's headers under
// keys no header can have, reads it back, and strips it from the headers
// that become properties; a user header named traceparent is untouched.
func TestRowHeaders(t *testing.T) {
	rec, tp := recorder(t)
	tr := otelx.New(tp)
	user := map[string]string{"traceparent": "user-value", "tenant": "acme"}
	require.Equal(t, user, otelx.RowHeaders(context.Background(), user), "no span: unchanged")
	require.Equal(t, trace.SpanContext{}, otelx.RowSpanContext(`{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`),
		"a user header is not a stored context")

	ctx, req := tr.Start(context.Background(), "request", trace.SpanKindServer, otelx.Attrs{})
	h := otelx.RowHeaders(ctx, user)
	require.Len(t, user, 2, "the caller's map is not changed")
	b, err := json.Marshal(h)
	require.NoError(t, err)
	require.Contains(t, string(b), `"\u0000traceparent"`)
	sc := otelx.RowSpanContext(string(b))
	require.Equal(t, req.Recording(), true)
	require.Equal(t, trace.SpanContextFromContext(ctx).SpanID(), sc.SpanID())
	require.True(t, sc.IsRemote())
	var back map[string]string
	require.NoError(t, json.Unmarshal(b, &back))
	require.Equal(t, user, otelx.StripRow(back))
	require.Nil(t, otelx.StripRow(map[string]string{otelx.RowKeyPrefix + otelx.PropTraceparent: "x"}))
	req.End("", "")

	// Dispatch, tracing on: a child of the stored context.
	dctx, d := tr.StartDispatch(context.Background(), string(b), otelx.Attrs{Destination: "orders", Attempt: 2})
	d.End("sent", "")
	ds := byName(t, rec, otelx.SpanDispatch)
	require.Equal(t, sc.SpanID(), ds.Parent().SpanID())
	require.Equal(t, int64(2), attrs(ds)[otelx.AttrAttempt].AsInt64())
	require.Equal(t, ds.SpanContext(), trace.SpanContextFromContext(dctx))

	// Tracing on, nothing stored, started under an unrelated span: a root.
	startCtx, start := tr.Start(context.Background(), "start", trace.SpanKindInternal, otelx.Attrs{})
	start.End("", "")
	_, d = tr.StartDispatch(startCtx, `{"tenant":"acme"}`, otelx.Attrs{})
	d.End("sent", "")
	require.False(t, rec.Ended()[len(rec.Ended())-1].Parent().IsValid(), "a new root")

	// Tracing off: the stored context is passed on, an unrelated one removed.
	var off *otelx.Tracer
	ctx, _ = off.StartDispatch(startCtx, string(b), otelx.Attrs{})
	require.Equal(t, sc.SpanID(), trace.SpanContextFromContext(ctx).SpanID())
	ctx, _ = off.StartDispatch(startCtx, `{"tenant":"acme"}`, otelx.Attrs{})
	require.False(t, trace.SpanContextFromContext(ctx).IsValid())
	m := primitive.NewMessage("orders", nil)
	otelx.InjectContext(ctx, m)
	require.Empty(t, m.GetProperty(otelx.PropTraceparent))
}

// A replay span is a child of the run's context, linked to the trace the
// message was parked with.
func TestStartLinked(t *testing.T) {
	rec, tp := recorder(t)
	tr := otelx.New(tp)
	p := props("evt-1")
	octx, orig := tr.Start(context.Background(), otelx.SpanSend, trace.SpanKindProducer, otelx.Attrs{})
	tr.Inject(octx, p)
	orig.End("", "")
	rctx, run := tr.Start(context.Background(), "replay run", trace.SpanKindInternal, otelx.Attrs{})
	_, sp := tr.StartLinked(rctx, p, otelx.SpanReplay, trace.SpanKindProducer, otelx.Attrs{})
	sp.End("sent", "")
	run.End("", "")
	r := byName(t, rec, otelx.SpanReplay)
	require.Equal(t, trace.SpanContextFromContext(rctx).SpanID(), r.Parent().SpanID())
	require.Len(t, r.Links(), 1)
	require.Equal(t, trace.SpanContextFromContext(octx).SpanID(), r.Links()[0].SpanContext.SpanID())
}
