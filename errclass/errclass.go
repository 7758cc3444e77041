// Package errclass is the one vocabulary of failure classes that rmqtx's
// consumer, outbox and replay share: how a failed attempt is handled, what
// a dead letter records, and the label a metric carries. Each component
// maps a class onto what it can do (a consumer can wait; an outbox send
// cannot), but the names, the error type (Error) and the reading of an
// error (ClassOf, CodeOf) are the same everywhere, so an error a handler
// classifies with one package is understood by the other.
//
// consumer.Error and outbox.SendError are aliases of Error, and the
// consumer's and the outbox's constructors (consumer.Permanent,
// outbox.Permanent, ...) build one. ClassOf falls back to Unknown for an
// error nobody classified: it is what Unknown means. A component that
// handles such an error otherwise says so and does it itself: the outbox
// retries an unclassified send error as Transient (outbox.ClassOf), the
// consumer retries an unclassified handler error as Unknown, the fallback.
//
// txproducer.RetryAdvice is not a class, and answers another question. A
// class says how rmqtx itself handles a failed attempt of work it owns (a
// delivery, an outbox row, a replayed dead letter). An Advice is said to
// the caller of txproducer's Send, who owns the retry: whether to call Send
// again, and with which event id (the same one, a new one, or not at all).
// Where both read a broker's answer they read it from the same table
// (internal/broker/brokerclass): a Permanent answer there is DontRetry for
// a Send. A Send's errors carry no class (ClassOf says Unknown): read them
// with RetryAdvice.
package errclass

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
	// Crash: the work ended its process (a consumer's handler that crashed
	// or killed it) as many times as the retry bound allows. Counted before
	// each run, because a crash leaves no error to classify; parked, never
	// run again.
	Crash Class = "crash"
)

// All lists every class.
var All = []Class{Transient, Wait, Permanent, Data, Conflict, Unknown, Crash}

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
