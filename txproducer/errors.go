package txproducer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// Sentinel errors. Every error from this package wraps one of them. Which
// retry is safe after each one is stated here and returned by RetryAdvice:
// only ErrCommitUnknown may be retried with the same event id, because any
// other failure has spent the id (a ROLLED_BACK row was persisted, or a
// check will fence it) and a Send with a spent id returns ErrFenced.
var (
	// ErrConfig: the Config is invalid (at New), or does not fit the
	// broker's settings (at Start, see BrokerSettingsError). Do not retry.
	ErrConfig = errors.New("txproducer: invalid config")
	// ErrInvalidMessage: the message was rejected before anything was sent.
	// Do not retry: fix the message.
	ErrInvalidMessage = errors.New("txproducer: invalid message")
	// ErrPayloadTooLarge: the payload exceeds MaxPayloadBytes (also wraps
	// ErrInvalidMessage). Nothing was sent. Do not retry.
	ErrPayloadTooLarge = errors.New("txproducer: payload too large")
	// ErrNotStarted: Send before Start. Do not retry.
	ErrNotStarted = errors.New("txproducer: not started")
	// ErrClosed: Send or Start after Shutdown. Do not retry.
	ErrClosed = errors.New("txproducer: shut down")
	// ErrSend: the half message could not be stored by the broker, or was
	// stored but the client did not run the local transaction. Nothing
	// committed. Retry with a NEW event id: a half may be stored under the
	// old one, and a check fences it.
	ErrSend = errors.New("txproducer: send half message")
	// ErrDatabase: the database failed before the local transaction could
	// commit. Nothing committed. Retry with a NEW event id: the rollback was
	// persisted (or a check fences the id), so the old id is spent.
	ErrDatabase = errors.New("txproducer: database")
	// ErrLocalTx: the caller's function returned an error or panicked; the
	// transaction was rolled back and the id is spent. errors.Is/As reach
	// the cause; whether to try again (with a new id) is the caller's call,
	// so RetryAdvice says DontRetry.
	ErrLocalTx = errors.New("txproducer: local transaction failed")
	// ErrFenced: a decision for this event id already exists as ROLLED_BACK
	// (a check fenced it, or an earlier attempt rolled back). Nothing
	// committed under this id, and nothing ever will: if the event is still
	// wanted, send it with a new event id.
	ErrFenced = errors.New("txproducer: event id already rolled back")
	// ErrEventIDConflict: the event id was committed earlier with a
	// different payload. Nothing new committed. Do not retry: two events
	// share an id (invariant I5).
	ErrEventIDConflict = errors.New("txproducer: event id committed with a different payload")
	// ErrCommitUnknown: COMMIT returned an error and the outcome could not
	// be read back. The txlog decides. This is the one error to retry with
	// the SAME event id (Result.EventID): the retry learns the outcome
	// without a second copy; a committed event comes back as State
	// Committed with Duplicate set, one that did not commit as ErrFenced.
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

// BrokerSettingsError is returned by Start (it wraps ErrConfig) when
// FenceAge does not fit a broker's transaction-check settings and discard
// recovery is disabled; with recovery running the same finding is logged as
// a warning. The broker checks a half message first at TransactionTimeOut,
// then every CheckInterval, CheckMax times, and then discards it; FenceAge
// must leave one check after it (see package checkback):
//
//	FenceAge + CheckInterval < TransactionTimeOut + (CheckMax-1) x CheckInterval
//
// Otherwise a half whose local transaction never ran, or ran too long, is
// discarded before any check could fence it, and only recovery resolves it.
type BrokerSettingsError struct {
	Broker             string
	FenceAge           time.Duration
	TransactionTimeOut time.Duration
	CheckInterval      time.Duration
	CheckMax           int
}

// MaxFenceAge is the exclusive upper bound the broker's settings put on
// FenceAge (zero or negative: no FenceAge fits).
func (e *BrokerSettingsError) MaxFenceAge() time.Duration {
	return maxFenceAge(e.TransactionTimeOut, e.CheckInterval, e.CheckMax)
}

func (e *BrokerSettingsError) Error() string {
	return fmt.Sprintf("txproducer: FenceAge %s does not fit broker %s (transactionTimeOut %s, transactionCheckInterval %s, transactionCheckMax %d): "+
		"want FenceAge + transactionCheckInterval < transactionTimeOut + (transactionCheckMax-1) x transactionCheckInterval, i.e. FenceAge < %s",
		e.FenceAge, e.Broker, e.TransactionTimeOut, e.CheckInterval, e.CheckMax, e.MaxFenceAge())
}

// Unwrap makes errors.Is(err, ErrConfig) true.
func (e *BrokerSettingsError) Unwrap() error { return ErrConfig }

func maxFenceAge(timeout, interval time.Duration, checkMax int) time.Duration {
	return timeout + time.Duration(checkMax-1)*interval - interval
}

// Advice says whether and how a failed Send may be retried.
type Advice int

// Advices.
const (
	// DontRetry: nil, or sending again cannot help (invalid config or
	// message, the caller's function refused, an id conflict, closed).
	DontRetry Advice = iota
	// RetryWithNewID: nothing committed and the event id is spent; a Send
	// with a new event id (Message.EventID empty) may succeed. The caller's
	// function runs again.
	RetryWithNewID
	// RetryWithSameID: the outcome is unknown; Send again with the same
	// event id (Result.EventID) to learn it. Only ErrCommitUnknown.
	RetryWithSameID
)

func (a Advice) String() string {
	switch a {
	case RetryWithNewID:
		return "retry with a new event id"
	case RetryWithSameID:
		return "retry with the same event id"
	default:
		return "do not retry"
	}
}

// RetryAdvice classifies a Send error: RetryWithSameID for ErrCommitUnknown
// (the only one whose outcome is open), RetryWithNewID for ErrSend,
// ErrDatabase and ErrFenced (nothing committed, the id is spent), and for
// an ErrLocalTx whose cause is the database rolling the transaction back
// (a deadlock, a serialization failure under REPEATABLE READ or
// SERIALIZABLE, a lock wait timeout: running it again may succeed),
// DontRetry for everything else, nil included.
func RetryAdvice(err error) Advice {
	switch {
	case err == nil:
		return DontRetry
	case errors.Is(err, ErrCommitUnknown):
		return RetryWithSameID
	case errors.Is(err, ErrSend), errors.Is(err, ErrDatabase), errors.Is(err, ErrFenced):
		return RetryWithNewID
	case errors.Is(err, ErrLocalTx) && dialect.RolledBack(err):
		return RetryWithNewID
	default:
		return DontRetry
	}
}

// IsRetryable reports whether sending again may succeed: the failure was in
// the broker or the database (or the id was fenced), not in the message or
// the caller's function. It is RetryAdvice(err) != DontRetry; RetryAdvice
// says with which event id, and only ErrCommitUnknown takes the same one.
func IsRetryable(err error) bool {
	return RetryAdvice(err) != DontRetry
}

// Causes of the end of a local transaction's context (context.Cause).
var (
	errLocalTxTimeout = fmt.Errorf("txproducer: LocalTxTimeout reached after the half message was stored: %w", context.DeadlineExceeded)
	errSendEnded      = errors.New("txproducer: send ended")
)

func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
