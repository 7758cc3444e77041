package consumer

import (
	"context"

	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/otelx"
)

// Process handles one message: decode, dedup, guard, handle, commit - or
// classify the failure and retry or park. The caller ACKs the message only
// when the outcome's Ack() is true; by then everything is committed.
//
// With ProcessorConfig.TracerProvider it is a consume span, a child of the
// trace context the message carries, and the handler's ctx holds it.
func (p *Processor) Process(ctx context.Context, m Message) Outcome {
	if p.tr == nil || ctx.Value(batchKey{}) != nil {
		// Off, or ProcessBatch's checking pass, which applies nothing.
		return p.process(ctx, m)
	}
	ctx, sp := p.tr.StartFromProps(ctx, m.Properties, otelx.SpanConsume, trace.SpanKindConsumer,
		otelx.Attrs{Destination: m.Delivery.Topic, Group: p.cfg.Group, MsgID: m.Delivery.MsgID, Attempt: m.Delivery.ReconsumeTimes + 1})
	o := p.process(ctx, m)
	sp.SetEvent(o.EventID, "") // an adopted message's id is not in its properties
	errType := ""
	if o.Err != nil {
		errType = string(o.Class)
	}
	sp.End(string(o.Result), errType)
	return o
}
