// Package errclass is the one vocabulary of failure classes that rmqtx's
// consumer, outbox and replay share: how a failed attempt is handled, what
// a dead letter records, and the label a metric carries. Each component
// maps a class onto what it can do (a consumer can wait; an outbox send
// cannot), but the names and the type are the same everywhere, so an error
// a handler classifies with one package is understood by the other.
package errclass

import "errors"

// Class is how a failure is handled. It is stored (dead letters, outbox
// error codes) and used as a metrics label, so the set is small and fixed.
type Class string

// The classes (invariant I7 in the README's "Design and invariants").
const (
	// Transient: infrastructure trouble (database, network, timeouts).
	// Retried with backoff, bounded, then parked.
	Transient Class = "transient"
	// Wait: a business condition is not met yet (an aggregate version gap,
	// say). Retried later, bounded, then parked. A send treats it as
	// Transient.
	Wait Class = "wait"
	// Permanent: the business (or the receiver) rejects the work for good.
	// Parked (or DEAD) at once.
	Permanent Class = "permanent"
	// Data: the message itself is unusable (malformed, undecodable, unknown
	// type, hash mismatch). Parked at once.
	Data Class = "data"
	// Conflict: an event id reused with a different payload (I5). Parked
	// with both hashes, never applied.
	Conflict Class = "conflict"
	// Unknown: nobody classified the error, or the outcome is unknown (a
	// timeout after the request left). Retried like Transient, labelled
	// apart so it shows.
	Unknown Class = "unknown"
)

// All lists every class.
var All = []Class{Transient, Wait, Permanent, Data, Conflict, Unknown}

// String returns the class name.
func (c Class) String() string { return string(c) }

// Valid reports whether c is one of All.
func (c Class) Valid() bool {
	for _, k := range All {
		if c == k {
			return true
		}
	}
	return false
}

// Retryable reports whether work that failed with c may be tried again:
// Transient, Wait and Unknown.
func (c Class) Retryable() bool { return c == Transient || c == Wait || c == Unknown }

// Classified is an error that carries its class. consumer.Error and
// outbox.SendError implement it, and so may a caller's own error types.
type Classified interface {
	error
	ErrorClass() Class
}

// Of returns the class of the outermost Classified error in err's chain,
// and false when there is none.
func Of(err error) (Class, bool) {
	var c Classified
	if errors.As(err, &c) {
		if k := c.ErrorClass(); k.Valid() {
			return k, true
		}
	}
	return "", false
}
