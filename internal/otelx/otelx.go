// Package otelx is rmqtx's optional OpenTelemetry tracing: the W3C trace
// context carried in message properties, and the spans of the producer,
// the check answer, the consumer, the outbox dispatcher, replay and discard
// recovery.
//
// Every component takes a trace.TracerProvider in its Config. nil (the
// default) gives a nil *Tracer, and every method of a nil *Tracer returns at
// once without allocating: tracing that is off costs a nil check. The
// benchmarks in this package measure that (BenchmarkSendTracingOff/On).
//
// The trace context travels as the plain message properties `traceparent`
// and `tracestate`, the names the W3C propagator writes and the
// OpenTelemetry Java agent's RocketMQ instrumentation puts in a message's
// user properties, so traces join across languages (WIRE.md, "Trace
// context"). Only the W3C trace context propagator is used: baggage never
// goes on the wire, because it may hold application data.
//
// Spans carry the event id and type, the topic, the group and message ids,
// never the payload, the business key or an error text (an error is
// recorded by its class only: error texts may quote data).
package otelx

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/wire"
)

// Message properties of the W3C trace context (https://www.w3.org/TR/trace-context/).
const (
	PropTraceparent = "traceparent"
	PropTracestate  = "tracestate"
	// MaxTracestateLen: a longer tracestate is not written (the W3C text
	// asks propagators to pass at least 512 characters on; the message
	// properties of RocketMQ are limited to 32 KB altogether).
	MaxTracestateLen = 512
)

// ScopeName is the instrumentation scope of rmqtx's tracer.
const ScopeName = "github.com/rmqtx/rmqtx"

// Span names. They are fixed (the topic is an attribute), so a backend can
// group by them.
const (
	SpanSend      = "rmqtx.send"      // txproducer.Send: half message, local transaction, end
	SpanHalfSend  = "rmqtx.half_send" // storing the half message, until the local transaction starts
	SpanLocalTx   = "rmqtx.local_tx"  // BEGIN, txlog row, the caller's function, COMMIT
	SpanCheck     = "rmqtx.check"     // answering the broker's transaction check
	SpanConsume   = "rmqtx.consume"   // consumer: dedup, guard, handler, commit (or retry, park)
	SpanDispatch  = "rmqtx.dispatch"  // outbox: one send of a row through the sink
	SpanReplay    = "rmqtx.replay"    // replay: one dead letter sent again
	SpanRepublish = "rmqtx.republish" // discard recovery: a committed event published again
)

// Attribute keys. The messaging.* keys follow the OpenTelemetry messaging
// semantic conventions.
const (
	AttrEventID     = attribute.Key("rmqtx.event_id")
	AttrEventType   = attribute.Key("rmqtx.event_type")
	AttrOutcome     = attribute.Key("rmqtx.outcome")
	AttrAttempt     = attribute.Key("rmqtx.attempt")
	AttrReason      = attribute.Key("rmqtx.reason")
	AttrSystem      = attribute.Key("messaging.system")
	AttrDestination = attribute.Key("messaging.destination.name")
	AttrGroup       = attribute.Key("messaging.rocketmq.client_group")
	AttrMessageID   = attribute.Key("messaging.message.id")
	AttrErrorType   = attribute.Key("error.type")
)

var (
	propagator = propagation.TraceContext{}
	systemAttr = AttrSystem.String("rocketmq")
)

// Tracer starts rmqtx's spans. A nil *Tracer is tracing off: every method
// returns at once and Span values it returns do nothing.
type Tracer struct{ t trace.Tracer }

// New returns the tracer of tp, or nil (tracing off) when tp is nil.
func New(tp trace.TracerProvider) *Tracer {
	if tp == nil {
		return nil
	}
	return &Tracer{t: tp.Tracer(ScopeName)}
}

// On reports whether tracing is on.
func (t *Tracer) On() bool { return t != nil }

// Attrs are a span's attributes. Empty strings (and Attempt 0) are left out.
type Attrs struct {
	Destination string // topic, or an outbox destination
	Group       string // producer or consumer group
	EventID     string
	EventType   string
	MsgID       string
	Attempt     int
}

func (a Attrs) list() []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 7)
	kv = append(kv, systemAttr)
	for _, p := range [...]struct {
		k attribute.Key
		v string
	}{{AttrDestination, a.Destination}, {AttrGroup, a.Group}, {AttrEventID, a.EventID}, {AttrEventType, a.EventType}, {AttrMessageID, a.MsgID}} {
		if p.v != "" {
			kv = append(kv, p.k.String(p.v))
		}
	}
	if a.Attempt > 0 {
		kv = append(kv, AttrAttempt.Int(a.Attempt))
	}
	return kv
}

// Span is one rmqtx span. The zero value (tracing off) does nothing.
type Span struct{ s trace.Span }

// Start starts a span that is a child of ctx's span (a root without one).
func (t *Tracer) Start(ctx context.Context, name string, kind trace.SpanKind, a Attrs) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	ctx, s := t.t.Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(a.list()...))
	return ctx, Span{s}
}

// StartFromProps starts a span whose parent is the trace context in props
// (a message's properties), or ctx's span when props carry none. The event
// id and type are read from props when a leaves them empty.
func (t *Tracer) StartFromProps(ctx context.Context, props map[string]string, name string, kind trace.SpanKind, a Attrs) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	if a.EventID == "" {
		a.EventID = props[wire.PropEventID]
	}
	if a.EventType == "" {
		a.EventType = props[wire.PropEventType]
	}
	return t.Start(propagator.Extract(ctx, mapCarrier(props)), name, kind, a)
}

// StartFromMessage is StartFromProps over m's properties.
func (t *Tracer) StartFromMessage(ctx context.Context, m *broker.Message, name string, kind trace.SpanKind, a Attrs) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	if a.EventID == "" {
		a.EventID = m.GetProperty(wire.PropEventID)
	}
	if a.EventType == "" {
		a.EventType = m.GetProperty(wire.PropEventType)
	}
	return t.Start(propagator.Extract(ctx, messageCarrier{m}), name, kind, a)
}

// StartLinked starts a child of ctx's span linked to the trace context in
// props (the trace a replayed message first belonged to), if any.
func (t *Tracer) StartLinked(ctx context.Context, props map[string]string, name string, kind trace.SpanKind, a Attrs) (context.Context, Span) {
	if t == nil {
		return ctx, Span{}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(kind), trace.WithAttributes(a.list()...)}
	if sc := trace.SpanContextFromContext(propagator.Extract(context.Background(), mapCarrier(props))); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	ctx, s := t.t.Start(ctx, name, opts...)
	return ctx, Span{s}
}

// Inject writes ctx's span context into props (traceparent, and tracestate
// when set and at most MaxTracestateLen bytes), replacing the trace context
// props carried. Without a valid span context in ctx, props are unchanged.
func (t *Tracer) Inject(ctx context.Context, props map[string]string) {
	if t == nil || !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	delete(props, PropTracestate) // the new span's tracestate, or none
	propagator.Inject(ctx, mapCarrier(props))
}

// InjectMessage is Inject into m's properties.
func (t *Tracer) InjectMessage(ctx context.Context, m *broker.Message) {
	if t == nil {
		return
	}
	InjectContext(ctx, m)
}

// InjectContext writes ctx's span context into m's properties if ctx has a
// valid one, whatever the tracer: a sink uses it to carry on the context its
// caller (the outbox dispatcher) chose.
func InjectContext(ctx context.Context, m *broker.Message) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	m.RemoveProperty(PropTracestate)
	propagator.Inject(ctx, messageCarrier{m})
}

// InjectSpanContext writes sc into m's properties if it is valid (the
// context an outbox message carries).
func InjectSpanContext(sc trace.SpanContext, m *broker.Message) {
	if !sc.IsValid() {
		return
	}
	InjectContext(trace.ContextWithRemoteSpanContext(context.Background(), sc), m)
}

// Recording reports whether s records (tracing on and sampled).
func (s Span) Recording() bool { return s.s != nil && s.s.IsRecording() }

// SetEvent sets the event id and type, when not empty (known only after
// the span started).
func (s Span) SetEvent(id, typ string) {
	if s.s == nil {
		return
	}
	if id != "" {
		s.s.SetAttributes(AttrEventID.String(id))
	}
	if typ != "" {
		s.s.SetAttributes(AttrEventType.String(typ))
	}
}

// SetMsgID sets the message id once the broker returned it.
func (s Span) SetMsgID(id string) {
	if s.s == nil || id == "" {
		return
	}
	s.s.SetAttributes(AttrMessageID.String(id))
}

// SetReason sets why an outcome was chosen (a check's reason, an error class).
func (s Span) SetReason(r string) {
	if s.s == nil || r == "" {
		return
	}
	s.s.SetAttributes(AttrReason.String(r))
}

// End ends the span with an outcome (committed, applied, sent, ...) and,
// when errType is not empty, an error status of that class. errType must be
// a short, fixed word: never an error's text.
func (s Span) End(outcome, errType string) {
	if s.s == nil {
		return
	}
	if outcome != "" {
		s.s.SetAttributes(AttrOutcome.String(outcome))
	}
	if errType != "" {
		s.s.SetAttributes(AttrErrorType.String(errType))
		s.s.SetStatus(codes.Error, errType)
	}
	s.s.End()
}

// EndSend ends a span around a normal send: outcome "sent" with the
// message id, or error type "send" (the call failed) or "send_status" (the
// broker stored it with a non-OK status).
func (s Span) EndSend(r *broker.SendResult, err error) {
	if s.s == nil {
		return
	}
	// The one reading of a send's answer (broker.SendOutcome).
	if errType := broker.SendOutcome(r, err); errType != "" {
		s.End("", errType)
		return
	}
	s.SetMsgID(r.MsgID)
	s.End("sent", "")
}

// mapCarrier carries the trace context in a property map. It reads and
// writes only the W3C keys.
type mapCarrier map[string]string

var carrierKeys = []string{PropTraceparent, PropTracestate}

func (c mapCarrier) Get(k string) string { return c[k] }

func (c mapCarrier) Set(k, v string) {
	if k == PropTracestate && len(v) > MaxTracestateLen {
		return
	}
	c[k] = v
}

func (c mapCarrier) Keys() []string { return carrierKeys }

// messageCarrier carries the trace context in a message's properties.
type messageCarrier struct{ m *broker.Message }

func (c messageCarrier) Get(k string) string { return c.m.GetProperty(k) }

func (c messageCarrier) Set(k, v string) {
	if k == PropTracestate && len(v) > MaxTracestateLen {
		return
	}
	c.m.WithProperty(k, v)
}

func (c messageCarrier) Keys() []string { return carrierKeys }
