package otelx_test

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/otelx"
)

// The tracing hooks of one txproducer.Send (send, half send and local
// transaction spans, trace context injected into the properties) and of
// one consume (context extracted from the properties, consume span), with
// tracing off (nil TracerProvider), with an SDK provider that samples
// everything (spans are recorded, then dropped: no exporter), and with one
// that samples nothing. Run:
//
//	go test -run '^$' -bench 'Tracing' -benchmem ./internal/otelx/
func benchSend(b *testing.B, tr *otelx.Tracer) {
	p := props("evt-1")
	b.ReportAllocs()
	for b.Loop() {
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
	}
}

func benchConsume(b *testing.B, tr *otelx.Tracer) {
	p := props("evt-1")
	p[otelx.PropTraceparent] = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	b.ReportAllocs()
	for b.Loop() {
		_, sp := tr.StartFromProps(context.Background(), p, otelx.SpanConsume, trace.SpanKindConsumer,
			otelx.Attrs{Destination: "orders", Group: "cg", MsgID: "AC110001"})
		sp.End("applied", "")
	}
}

func provider(b *testing.B, s sdktrace.Sampler) *otelx.Tracer {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(s))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return otelx.New(tp)
}

func BenchmarkSendTracingOff(b *testing.B) { benchSend(b, nil) }
func BenchmarkSendTracingOn(b *testing.B)  { benchSend(b, provider(b, sdktrace.AlwaysSample())) }
func BenchmarkSendTracingSampledOut(b *testing.B) {
	benchSend(b, provider(b, sdktrace.NeverSample()))
}
func BenchmarkConsumeTracingOff(b *testing.B) { benchConsume(b, nil) }
func BenchmarkConsumeTracingOn(b *testing.B)  { benchConsume(b, provider(b, sdktrace.AlwaysSample())) }
func BenchmarkConsumeTracingSampledOut(b *testing.B) {
	benchConsume(b, provider(b, sdktrace.NeverSample()))
}
