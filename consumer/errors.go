package consumer

import (
	"errors"
	"fmt"

	"github.com/rmqtx/rmqtx/errclass"
)

// Class is how a failed attempt is handled: the one vocabulary rmqtx's
// consumer, outbox and replay share (package errclass). It is stored in the
// dead-letter table and used as a metrics label.
type Class = errclass.Class

// The error classes (invariant I7 in the README's "Design and invariants"
// section), as the consumer handles them.
const (
	// ClassTransient: infrastructure trouble (DB, network, timeouts). Retried
	// with RocketMQ delay levels up to MaxRetries, then parked.
	ClassTransient = errclass.Transient
	// ClassWait: a business condition is not met yet (including a strict
	// version gap). Retried with a delay up to MaxWaits, then parked.
	ClassWait = errclass.Wait
	// ClassPermanent: the business rejects the event for good. Parked at once.
	ClassPermanent = errclass.Permanent
	// ClassData: the message itself is unusable (malformed envelope, payload
	// that cannot be decoded, unknown event type, hash mismatch). Parked at once.
	ClassData = errclass.Data
	// ClassConflict: same event id as an applied event but a different
	// payload hash (I5). Parked with both hashes; never applied.
	ClassConflict = errclass.Conflict
	// ClassUnknown: an error nobody classified. Handled like ClassTransient
	// (retried up to MaxRetries, then parked) but labelled apart so it shows.
	ClassUnknown = errclass.Unknown
)

// Sentinel errors. Every error this package returns wraps one of them or an
// *Error, so errors.Is / errors.As work.
var (
	// ErrConflict is wrapped by the error of a parked payload-hash conflict.
	ErrConflict = errors.New("consumer: event id reused with a different payload")
	// ErrVersionGap is the Wait error of strict mode when an earlier aggregate
	// version has not been applied yet.
	ErrVersionGap = errors.New("consumer: aggregate version gap")
	// ErrUnknownEventType is the Data error for an event type with no route.
	ErrUnknownEventType = errors.New("consumer: no route for event type")
	// ErrMalformed is the Data error for a message whose envelope cannot be
	// decoded or whose payload does not match its declared hash.
	ErrMalformed = errors.New("consumer: malformed message")
	// ErrRetryLimit is wrapped when a retryable failure ran out of attempts
	// and was parked.
	ErrRetryLimit = errors.New("consumer: retry limit reached")
	// ErrHandlerPanic is wrapped when a handler panicked (class unknown).
	ErrHandlerPanic = errors.New("consumer: handler panicked")
	// ErrNotFound is returned by DeadLetterStore.Get for a missing id.
	ErrNotFound = errors.New("consumer: not found")
	// ErrNotParked is returned when a dead letter is not in status PARKED.
	ErrNotParked = errors.New("consumer: dead letter is not parked")
	// ErrClosed is returned by Start after Shutdown or Close.
	ErrClosed = errors.New("consumer: closed")
	// ErrConfig is wrapped by every configuration error.
	ErrConfig = errors.New("consumer: invalid config")
)

// Error carries a class with the underlying error. Build it with Transient,
// Wait, Permanent or BadData; read it with ClassOf.
type Error struct {
	Class Class
	Err   error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return "consumer: " + string(e.Class)
	}
	return fmt.Sprintf("consumer: %s: %v", e.Class, e.Err)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// ErrorClass returns the error's class (errclass.Classified): the outbox
// package reads it too, so a handler's consumer.Permanent(err) is as final
// for an outbox send as outbox.Permanent(err) is for a handler.
func (e *Error) ErrorClass() errclass.Class { return e.Class }

func classify(c Class, err error) error {
	if err == nil {
		err = errors.New(string(c))
	}
	return &Error{Class: c, Err: err}
}

// Transient marks err as a temporary infrastructure failure: retried later.
func Transient(err error) error { return classify(ClassTransient, err) }

// Wait marks err as "a business precondition is not met yet": retried later,
// a bounded number of times (MaxWaits), then parked.
func Wait(err error) error { return classify(ClassWait, err) }

// Permanent marks err as a final business rejection: parked at once.
func Permanent(err error) error { return classify(ClassPermanent, err) }

// BadData marks err as "this message can never be processed" (it cannot be
// decoded or validated): parked at once.
func BadData(err error) error { return classify(ClassData, err) }

// ClassOf returns the class of err: that of the outermost classified error
// in its chain (errclass.Of: an *Error, an *outbox.SendError, or any
// errclass.Classified), else the class of the package's sentinels, else
// ClassUnknown. It returns "" for nil.
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	if c, ok := errclass.Of(err); ok {
		return c
	}
	switch {
	case errors.Is(err, ErrConflict):
		return ClassConflict
	case errors.Is(err, ErrVersionGap):
		return ClassWait
	case errors.Is(err, ErrUnknownEventType), errors.Is(err, ErrMalformed):
		return ClassData
	}
	return ClassUnknown
}

// IsRetryable reports whether err leads to a later redelivery (transient,
// wait or unknown) rather than being parked at once.
func IsRetryable(err error) bool {
	return ClassOf(err).Retryable()
}
