package outbox

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

// Message is what a dispatcher hands to a Sink: the event as stored plus the
// attempt number.
type Message struct {
	Event
	// Attempt counts sends of this row, starting at 1. A lease takeover or a
	// crash can make two attempts carry the same number.
	Attempt int

	trace trace.SpanContext // see SpanContext (tracing.go)
}

// IdempotencyKey is the key an external system deduplicates on: the event
// id, identical on every resend.
func (m *Message) IdempotencyKey() string { return m.EventID }

// Sink delivers one message. It returns nil only when the receiver has the
// message. Errors are classified with Permanent, Transient and Unknown (or a
// *SendError, or any errclass.Classified error); unclassified errors are
// transient (a context deadline: unknown), unlike errclass.ClassOf's
// fallback, on purpose (see ClassOf). Send must honour ctx: the
// dispatcher bounds each send with Config.SendTimeout and cancels in-flight
// sends when Shutdown's context ends. Send is called concurrently.
type Sink interface {
	Send(ctx context.Context, m *Message) error
}

// FuncSink adapts a function to Sink. It is the command outbox: the function
// calls an external system (HTTP, SMS, payment gateway) and passes
// m.IdempotencyKey() so a resend after a crash or a lost response is absorbed
// by the receiver. Use FromHTTPStatus to classify HTTP responses.
type FuncSink func(ctx context.Context, m *Message) error

// Send calls f.
func (f FuncSink) Send(ctx context.Context, m *Message) error { return f(ctx, m) }
