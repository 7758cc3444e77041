package otelx

import (
	"context"
	"encoding/json"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// RowKeyPrefix starts the keys under which the outbox keeps a row's trace
// context in its headers column (a JSON object of strings). Header names
// cannot contain control characters (wire.CheckText), so these keys never
// collide with a user header, and StripRow removes them before the headers
// become message properties.
const RowKeyPrefix = "\x00"

// rowMarker is how the prefixed traceparent key looks in the JSON text.
const rowMarker = `"\u0000` + PropTraceparent + `"`

// RowHeaders returns headers plus the span context of ctx under
// RowKeyPrefix keys, for outbox.Enqueue to store with the row. Without a
// valid span context in ctx it returns headers itself (no copy, no cost):
// the caller's own span, not a tracer of rmqtx's, is what is stored.
func RowHeaders(ctx context.Context, headers map[string]string) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return headers
	}
	out := make(map[string]string, len(headers)+2)
	for k, v := range headers {
		out[k] = v
	}
	propagator.Inject(ctx, rowCarrier(out))
	return out
}

// StripRow removes the trace context keys from headers read back from a
// row; it returns nil when nothing else is left.
func StripRow(headers map[string]string) map[string]string {
	if len(headers) == 0 {
		return headers
	}
	delete(headers, RowKeyPrefix+PropTraceparent)
	delete(headers, RowKeyPrefix+PropTracestate)
	if len(headers) == 0 {
		return nil
	}
	return headers
}

// RowSpanContext returns the span context stored in a row's headers JSON,
// or an invalid one. Rows without one cost a substring search.
func RowSpanContext(headersJSON string) trace.SpanContext {
	if !strings.Contains(headersJSON, rowMarker) {
		return trace.SpanContext{}
	}
	var h map[string]string
	if json.Unmarshal([]byte(headersJSON), &h) != nil {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), rowCarrier(h)))
}

// StartDispatch returns the context for one outbox send of a row whose
// headers column is headersJSON, and the dispatch span.
//
// With tracing on, the span is a child of the context stored at Enqueue, or
// a new root (never the span of the context the dispatcher was started
// with). With tracing off there is no span, and the stored context, if any,
// is passed on unchanged, so a traced Enqueue still joins the consumer's
// trace; a span of the start context is removed either way, so that the
// sink never puts an unrelated trace on the message.
func (t *Tracer) StartDispatch(ctx context.Context, headersJSON string, a Attrs) (context.Context, Span) {
	stored := RowSpanContext(headersJSON)
	if t == nil {
		switch {
		case stored.IsValid():
			return trace.ContextWithRemoteSpanContext(ctx, stored), Span{}
		case trace.SpanContextFromContext(ctx).IsValid():
			return trace.ContextWithSpanContext(ctx, trace.SpanContext{}), Span{}
		}
		return ctx, Span{}
	}
	kind := trace.WithSpanKind(trace.SpanKindProducer)
	attrs := trace.WithAttributes(a.list()...)
	if stored.IsValid() {
		ctx, s := t.t.Start(trace.ContextWithRemoteSpanContext(ctx, stored), SpanDispatch, kind, attrs)
		return ctx, Span{s}
	}
	ctx, s := t.t.Start(ctx, SpanDispatch, kind, attrs, trace.WithNewRoot())
	return ctx, Span{s}
}

// rowCarrier carries the trace context in a row's headers map, under
// RowKeyPrefix keys.
type rowCarrier map[string]string

func (c rowCarrier) Get(k string) string { return c[RowKeyPrefix+k] }

func (c rowCarrier) Set(k, v string) {
	if k == PropTracestate && len(v) > MaxTracestateLen {
		return
	}
	c[RowKeyPrefix+k] = v
}

func (c rowCarrier) Keys() []string { return carrierKeys }
