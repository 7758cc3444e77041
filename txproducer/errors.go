package txproducer

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error from this package wraps one of them.
var (
	// ErrConfig: the Config is invalid.
	ErrConfig = errors.New("txproducer: invalid config")
	// ErrInvalidMessage: the message was rejected before anything was sent.
	ErrInvalidMessage = errors.New("txproducer: invalid message")
	// ErrPayloadTooLarge: the payload exceeds MaxPayloadBytes (also wraps
	// ErrInvalidMessage). Nothing was sent.
	ErrPayloadTooLarge = errors.New("txproducer: payload too large")
	// ErrNotStarted: Send before Start.
	ErrNotStarted = errors.New("txproducer: not started")
	// ErrClosed: Send or Start after Shutdown.
	ErrClosed = errors.New("txproducer: shut down")
	// ErrSend: the half message could not be stored by the broker. The local
	// transaction did not run. Retryable.
	ErrSend = errors.New("txproducer: send half message")
	// ErrDatabase: the database failed before the local transaction could
	// commit. Nothing committed. Retryable.
	ErrDatabase = errors.New("txproducer: database")
	// ErrLocalTx: the caller's function returned an error or panicked; the
	// transaction was rolled back. errors.Is/As reach the cause.
	ErrLocalTx = errors.New("txproducer: local transaction failed")
	// ErrFenced: a decision for this event id already exists as ROLLED_BACK
	// (a check fenced it, or an earlier attempt rolled back). The id is spent:
	// send again with a new event id.
	ErrFenced = errors.New("txproducer: event id already rolled back")
	// ErrEventIDConflict: the event id was committed earlier with a
	// different payload. Nothing new committed.
	ErrEventIDConflict = errors.New("txproducer: event id committed with a different payload")
	// ErrCommitUnknown: COMMIT returned an error and the outcome could not
	// be read back. The txlog decides; Send again with the SAME event id to
	// learn the outcome (a committed event comes back as a Duplicate).
	ErrCommitUnknown = errors.New("txproducer: commit outcome unknown")
)

// PanicError is the cause inside ErrLocalTx when the caller's function
// panicked.
type PanicError struct {
	Value any
	Stack []byte
}

func (e *PanicError) Error() string {
	return fmt.Sprintf("txproducer: local transaction panicked: %v", e.Value)
}

// IsRetryable reports whether sending again may succeed: the failure was in
// the broker or the database, not in the message or the caller's function.
// Retry ErrCommitUnknown with the same event id.
func IsRetryable(err error) bool {
	return errors.Is(err, ErrSend) || errors.Is(err, ErrDatabase) || errors.Is(err, ErrCommitUnknown)
}

func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
