package consumer

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/otelx"
)

// startConsumeSpan starts Process's consume span (otelx.SpanConsume), a
// child of the trace context m carries, and returns the context the handler
// runs in. With tracing off it returns ctx and a span that does nothing.
func (p *Processor) startConsumeSpan(ctx context.Context, m Message) (context.Context, otelx.Span) {
	if p.tr == nil {
		return ctx, otelx.Span{}
	}
	return p.tr.StartFromProps(ctx, m.Properties, otelx.SpanConsume, trace.SpanKindConsumer,
		otelx.Attrs{Destination: m.Delivery.Topic, Group: p.cfg.Group, MsgID: m.Delivery.MsgID, Attempt: m.Delivery.ReconsumeTimes + 1})
}

// endConsumeSpan ends the consume span with o's result and, for a failure,
// its class (never the error's text).
func endConsumeSpan(sp otelx.Span, o Outcome) {
	sp.SetEvent(o.EventID, "") // an adopted message's id is not in its properties
	errType := ""
	if o.Err != nil {
		errType = string(o.Class)
	}
	sp.End(string(o.Result), errType)
}
