package outbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
)

// Sentinel errors. Every error the package returns wraps one of these or a
// *SendError, so callers test with errors.Is / errors.As.
var (
	// ErrInvalidEvent wraps every validation error of Enqueue.
	ErrInvalidEvent = errors.New("outbox: invalid event")
	// ErrDuplicateEvent is returned by Enqueue when the event id is already
	// in the table.
	ErrDuplicateEvent = errors.New("outbox: duplicate event id")
	// ErrNotFound is returned by Table.Get for an unknown event id.
	ErrNotFound = errors.New("outbox: event not found")
	// ErrInvalidConfig wraps every configuration error.
	ErrInvalidConfig = errors.New("outbox: invalid config")
	// ErrConfig is ErrInvalidConfig under the name every other rmqtx
	// package gives its configuration sentinel.
	ErrConfig = ErrInvalidConfig
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

// Class is how a failed send is handled.
type Class int

const (
	// ClassTransient: the send failed and may succeed later. RETRY with
	// backoff. Errors a Sink returns unclassified are transient.
	ClassTransient Class = iota
	// ClassUnknown: the outcome is unknown (timeout, connection lost after the
	// request left). RETRY with backoff; sending again is allowed because
	// consumers deduplicate by event id.
	ClassUnknown
	// ClassPermanent: retrying cannot help (topic missing, no permission,
	// invalid payload). DEAD at once.
	ClassPermanent
)

func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassUnknown:
		return "unknown"
	case ClassPermanent:
		return "permanent"
	default:
		return fmt.Sprintf("class(%d)", int(c))
	}
}

// SendError is a classified send failure. Code is a short machine-readable
// reason stored in last_error_code (for example "no_permission", "timeout").
type SendError struct {
	Class Class
	Code  string
	Err   error
}

func (e *SendError) Error() string {
	if e.Err == nil {
		return "outbox: " + e.Class.String() + " send error (" + e.Code + ")"
	}
	return e.Err.Error()
}

func (e *SendError) Unwrap() error { return e.Err }

// RetryClass returns the class name ("transient", "unknown", "permanent").
// The consumer package's *consumer.Error has the same method with a larger
// vocabulary; each package's ClassOf recognises the other's errors (and any
// error type with this method) without either importing the other.
func (e *SendError) RetryClass() string { return e.Class.String() }

// retryClasser is an error classified by this package, by the consumer
// package (*consumer.Error) or by the caller's own type.
type retryClasser interface{ RetryClass() string }

// classFromName maps a RetryClass name onto a Class. The consumer package's
// extra names map by what they mean for a send: "wait" (a precondition not
// met yet) is transient; "data" (the message can never be processed) and
// "conflict" (the event id was reused with another payload) are permanent.
// ok is false for a name outside the vocabulary.
func classFromName(name string) (c Class, ok bool) {
	switch name {
	case "transient", "wait":
		return ClassTransient, true
	case "unknown":
		return ClassUnknown, true
	case "permanent", "data", "conflict":
		return ClassPermanent, true
	}
	return 0, false
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
	return &SendError{Class: class, Code: code, Err: err}
}

// Permanent marks err as permanent: the row goes DEAD at once. nil stays nil.
func Permanent(err error) error { return NewSendError(ClassPermanent, "", err) }

// Transient marks err as transient: the row is retried with backoff.
func Transient(err error) error { return NewSendError(ClassTransient, "", err) }

// Unknown marks err as an unknown outcome (the receiver may have acted): the
// row is retried with backoff and the same event id.
func Unknown(err error) error { return NewSendError(ClassUnknown, "", err) }

// ClassOf returns the class of a send error: that of the outermost
// classified error in its chain (a *SendError, a *consumer.Error, or any
// error with a RetryClass() string method; see classFromName for the
// consumer's names). Unclassified errors, and RetryClass names outside the
// vocabulary, are transient, except context deadline errors, which are
// unknown.
func ClassOf(err error) Class {
	var rc retryClasser
	if errors.As(err, &rc) {
		if se, ok := rc.(*SendError); ok {
			return se.Class
		}
		if c, ok := classFromName(rc.RetryClass()); ok {
			return c
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ClassUnknown
	}
	return ClassTransient
}

// CodeOf returns the machine-readable code of a send error ("" for nil).
func CodeOf(err error) string {
	if err == nil {
		return ""
	}
	// The code of the error that decides the class: the outermost
	// classified one, when it is a *SendError.
	var rc retryClasser
	if errors.As(err, &rc) {
		if se, ok := rc.(*SendError); ok && se.Code != "" {
			return se.Code
		}
	}
	return ClassOf(err).String()
}

// IsPermanent reports whether err makes a row DEAD at once.
func IsPermanent(err error) bool { return err != nil && ClassOf(err) == ClassPermanent }

// IsUnknown reports whether err is an unknown outcome.
func IsUnknown(err error) bool { return err != nil && ClassOf(err) == ClassUnknown }

// IsRetryable reports whether err leads to a RETRY (transient or unknown).
func IsRetryable(err error) bool { return err != nil && ClassOf(err) != ClassPermanent }

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
