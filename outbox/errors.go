package outbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/wire"
)

// Sentinel errors. Every error the package returns wraps one of these or a
// *SendError, so callers test with errors.Is / errors.As.
var (
	// ErrInvalidEvent wraps every validation error of Enqueue.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrPayloadTooLarge: Enqueue refused a payload over MaxPayloadLen
	// (beside ErrInvalidEvent); nothing was written. It is
	// wire.ErrPayloadTooLarge, the error txproducer's Send returns for the
	// same limit (txproducer.ErrPayloadTooLarge).
	ErrPayloadTooLarge = wire.ErrPayloadTooLarge
	// ErrDuplicateEvent is returned by Enqueue when the event id is already
	// in the table.
	ErrDuplicateEvent = errors.New("outbox: duplicate event id")
	// ErrNotFound is returned by Table.Get for an unknown event id.
	ErrNotFound = errors.New("outbox: event not found")
	// ErrConfig wraps every configuration error.
	ErrConfig = errors.New("outbox: invalid config")
	// ErrClosed is returned by Start after Shutdown or Close.
	ErrClosed = errors.New("outbox: dispatcher closed")

	// ErrTopicNotExist: the broker does not know the destination topic.
	ErrTopicNotExist = errors.New("outbox: topic does not exist")
	// ErrNoPermission: the broker refuses writes to the destination.
	ErrNoPermission = errors.New("outbox: no permission to send")
	// ErrMessageIllegal: the broker (or the sink) rejects the message itself
	// (too large, bad properties).
	ErrMessageIllegal = errors.New("outbox: message rejected as illegal")
	// ErrInvalidDestination: the destination is not a valid topic name.
	ErrInvalidDestination = errors.New("outbox: invalid destination")
	// ErrNoRoute: the client found no route to the topic. The name server or
	// every broker may be down, or the topic may be missing with auto-create
	// off; the client cannot tell which, so it is transient (see RocketMQSink).
	ErrNoRoute = errors.New("outbox: no route to topic")
	// ErrSendTimeout: the send timed out; the message may or may not be stored.
	ErrSendTimeout = errors.New("outbox: send timed out")
)

// Class is how a failed send is handled: the one vocabulary rmqtx's
// consumer, outbox and replay share (package errclass). A send knows three
// of its classes; ClassOf maps the others onto them.
type Class = errclass.Class

const (
	// ClassTransient: the send failed and may succeed later. RETRY with
	// backoff. Errors a Sink returns unclassified are transient.
	ClassTransient = errclass.Transient
	// ClassUnknown: the outcome is unknown (timeout, connection lost after the
	// request left). RETRY with backoff; sending again is allowed because
	// consumers deduplicate by event id.
	ClassUnknown = errclass.Unknown
	// ClassPermanent: retrying cannot help (topic missing, no permission,
	// invalid payload). DEAD at once.
	ClassPermanent = errclass.Permanent
)

// SendError is a classified send failure: errclass.Error, the one type the
// consumer, the outbox and replay share (consumer.Error is the same type).
// Code is a short machine-readable reason stored in last_error_code (for
// example "no_permission", "timeout"). Its text is the wrapped error's.
type SendError = errclass.Error

// sendClass maps any class onto what a send can do: "wait" (a precondition
// not met yet) is transient; "data" (the message can never be processed) and
// "conflict" (the event id was reused with another payload) are permanent.
func sendClass(c errclass.Class) Class {
	switch c {
	case errclass.Wait:
		return ClassTransient
	case errclass.Data, errclass.Conflict:
		return ClassPermanent
	}
	return c
}

// NewSendError classifies err with an explicit code. A nil err returns nil.
// An empty code defaults to the class name.
func NewSendError(class Class, code string, err error) error {
	if err == nil {
		return nil
	}
	if code == "" {
		code = class.String()
	}
	return errclass.New(class, code, err)
}

// Permanent marks err as permanent: the row goes DEAD at once. nil stays nil.
func Permanent(err error) error { return NewSendError(ClassPermanent, "", err) }

// Transient marks err as transient: the row is retried with backoff.
func Transient(err error) error { return NewSendError(ClassTransient, "", err) }

// Unknown marks err as an unknown outcome (the receiver may have acted): the
// row is retried with backoff and the same event id.
func Unknown(err error) error { return NewSendError(ClassUnknown, "", err) }

// sendClassOf is how the dispatcher classifies a send error: the class
// errclass.Of reads in its chain (a *SendError, a consumer error, or any
// errclass.Classified), mapped by sendClass. An unclassified error is
// Transient here, on purpose and unlike errclass.ClassOf's Unknown: a sink's
// plain error (a refused connection, say) most often means nothing was sent,
// and it is retried with backoff either way; only a context deadline, after
// which the receiver may have acted, is Unknown.
func sendClassOf(err error) Class {
	if c, ok := errclass.Of(err); ok {
		return sendClass(c)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ClassUnknown
	}
	return ClassTransient
}

// ClassOf returns the class of a send error as the dispatcher handles it:
// that of the outermost classified error in its chain, mapped onto a send's
// three classes (wait is transient; data and conflict are permanent).
// Unclassified errors are transient, except context deadline errors, which
// are unknown.
//
// Deprecated: use errclass.ClassOf to read an error's class. It differs from
// this function in two ways, both the dispatcher's and kept by it: an
// unclassified error is Unknown there (Transient here, except a context
// deadline), and the consumer's wait, data and conflict classes are not
// mapped onto a send's.
func ClassOf(err error) Class { return sendClassOf(err) }

// CodeOf returns the machine-readable code of a send error ("" for nil): the
// Code of the classified error that decides its class, else the name of its
// class as the dispatcher handles it (sendClassOf), which is what
// last_error_code stores.
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	if c, ok := errclass.Find(err); ok {
		if se, ok := c.(*SendError); ok && se.Code != "" {
			return se.Code
		}
	}
	return sendClassOf(err).String()
}

// IsPermanent reports whether err makes a row DEAD at once.
func IsPermanent(err error) bool { return err != nil && sendClassOf(err) == ClassPermanent }

// IsUnknown reports whether err is an unknown outcome.
func IsUnknown(err error) bool { return err != nil && sendClassOf(err) == ClassUnknown }

// IsRetryable reports whether err leads to a RETRY (transient or unknown).
func IsRetryable(err error) bool { return err != nil && sendClassOf(err) != ClassPermanent }

// FromHTTPStatus classifies an HTTP response status for a FuncSink that calls
// an HTTP API: nil for 2xx; Transient for 408, 425, 429 and 5xx except 501;
// Permanent for every other status (the request itself is wrong).
func FromHTTPStatus(code int) error {
	switch {
	case code >= 200 && code < 300:
		return nil
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly, code == http.StatusTooManyRequests,
		code >= 500 && code != http.StatusNotImplemented:
		return NewSendError(ClassTransient, fmt.Sprintf("http_%d", code), fmt.Errorf("outbox: http status %d", code))
	default:
		return NewSendError(ClassPermanent, fmt.Sprintf("http_%d", code), fmt.Errorf("outbox: http status %d", code))
	}
}
