package consumer

import (
	"errors"

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
	// ClassCrash: the handler's process ended while it ran (a crash, an
	// os.Exit, a SIGKILL), counted before each run (ProcessorConfig.
	// NoCrashCount). Parked when the retry bound is spent, not run again.
	ClassCrash = errclass.Crash
)

// Sentinel errors. Every error this package returns wraps one of them or an
// *Error, so errors.Is / errors.As work. The four that decide a class
// (ErrConflict, ErrVersionGap, ErrUnknownEventType, ErrMalformed) are
// classified errors themselves (*Error), so errclass.ClassOf reads their
// class wherever they travel; their text is unchanged.
var (
	// ErrConflict is wrapped by the error of a parked payload-hash conflict.
	// Class Conflict.
	ErrConflict error = errclass.Wrap(ClassConflict, "", errors.New("consumer: event id reused with a different payload"))
	// ErrVersionGap is the Wait error of strict mode when an earlier aggregate
	// version has not been applied yet. Class Wait.
	ErrVersionGap error = errclass.Wrap(ClassWait, "", errors.New("consumer: aggregate version gap"))
	// ErrUnknownEventType is the Data error for an event type with no route.
	ErrUnknownEventType error = errclass.Wrap(ClassData, "", errors.New("consumer: no route for event type"))
	// ErrMalformed is the Data error for a message whose envelope cannot be
	// decoded or whose payload does not match its declared hash.
	ErrMalformed error = errclass.Wrap(ClassData, "", errors.New("consumer: malformed message"))
	// ErrRetryLimit is wrapped when a retryable failure ran out of attempts
	// and was parked.
	ErrRetryLimit = errors.New("consumer: retry limit reached")
	// ErrHandlerCrash is the error of an event parked with class Crash:
	// its handler's process ended while it ran, more often than
	// MaxRetries allows.
	ErrHandlerCrash = errors.New("consumer: the process ended while the handler ran")
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
	// ErrNotInHandler is returned by Event.SetResultRef called on an Event
	// that is not being handled: one a Handler did not receive (built by
	// hand, or decoded elsewhere), or after its Handler returned.
	ErrNotInHandler = errors.New("consumer: SetResultRef called outside a handler")
)

// Error is a classified error: errclass.Error, the one type the consumer,
// the outbox and replay share (outbox.SendError is the same type). Build it
// with Transient, Wait, Permanent or BadData; read it with errclass.ClassOf.
// Its text is the wrapped error's: the class is stored beside it (a dead
// letter's error_class), not in it.
type Error = errclass.Error

// classify wraps err with class c; a nil err gets the class name as text,
// so a handler's Permanent(nil) is still an error.
func classify(c Class, err error) error { return errclass.Wrap(c, "", err) }

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

// handlerClass is how the Processor classifies a handler's (or a Validate
// hook's) error: the class errclass.Find reads in its chain (an *Error, this
// package's classified sentinels, or any errclass.Classified), else
// ClassUnknown. An unclassified error is Unknown here on purpose, not by
// accident of the shared fallback: it is retried like a Transient one, up
// to MaxRetries, then parked, and labelled apart so it shows.
func handlerClass(err error) Class {
	if c, ok := errclass.Of(err); ok {
		return c
	}
	return ClassUnknown
}

// ClassOf returns the class of err as the consumer handles it: that of the
// outermost classified error in its chain, else ClassUnknown; "" for nil.
//
// Deprecated: use errclass.ClassOf, which returns the same class for every
// error (its fallback, Unknown, is the consumer's).
func ClassOf(err error) Class {
	if err == nil {
		return ""
	}
	return handlerClass(err)
}

// IsRetryable reports whether err leads to a later redelivery (transient,
// wait or unknown) rather than being parked at once.
func IsRetryable(err error) bool {
	return err != nil && handlerClass(err).Retryable()
}
