package outbox

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/otelx"
)

// SpanContext is the trace context the message carries to its receiver:
// the dispatch span's (Config.TracerProvider), or else the one stored at
// Enqueue, or none. RocketMQSink writes it as the traceparent and
// tracestate properties (WIRE.md); a custom sink may propagate it its own
// way (Send's ctx also holds it, for a single send).
func (m *Message) SpanContext() trace.SpanContext { return m.trace }

// startDispatch starts the dispatch span of one send of r (a child of the
// trace context stored at Enqueue) and sets the context m carries. It
// returns the send's context, which holds the span.
func (d *Dispatcher) startDispatch(ctx context.Context, r claimedRow, m *Message) (context.Context, otelx.Span) {
	ctx, sp := d.tr.StartDispatch(ctx, r.Headers.String,
		otelx.Attrs{Destination: r.Destination, EventID: r.EventID, EventType: r.EventType, Attempt: m.Attempt})
	m.trace = trace.SpanContextFromContext(ctx)
	return ctx, sp
}

// startDispatchBatch starts the dispatch span of every message of one batch
// send (each in its own trace); nil when tracing is off.
func (d *Dispatcher) startDispatchBatch(ctx context.Context, rows []claimedRow, msgs []*Message) []otelx.Span {
	var spans []otelx.Span
	if d.tr != nil {
		spans = make([]otelx.Span, len(rows))
	}
	for i := range rows {
		_, sp := d.startDispatch(ctx, rows[i], msgs[i])
		if spans != nil {
			spans[i] = sp
		}
	}
	return spans
}

// endDispatch ends a dispatch span with the send's result: "sent", or the
// error's class (never its text).
func endDispatch(sp otelx.Span, err error) {
	if err == nil {
		sp.End("sent", "")
		return
	}
	sp.End("", sendClassOf(err).String())
}

func endDispatchBatch(spans []otelx.Span, errs []error) {
	for i, sp := range spans {
		endDispatch(sp, errs[i])
	}
}
