package txproducer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/wire"
)

// Sentinel errors. Every error from this package wraps one of them. Which
// retry is safe after each one is stated here and returned by RetryAdvice.
// A failed Send does not spend its event id: a later Send with the same id
// may commit it (the txlog row of a rolled-back id is taken over, and every
// earlier half of the id is answered ROLLBACK), so an id derived from a
// business key can be retried after any ordinary failure. Only a committed
// id is final: sending it again returns Duplicate.
var (
	// ErrConfig: the Config is invalid (at New), or does not fit the
	// broker's settings (at Start, see BrokerSettingsError). Do not retry.
	ErrConfig = errors.New("txproducer: invalid config")
	// ErrInvalidMessage: the message was rejected before anything was sent.
	// Do not retry: fix the message.
	ErrInvalidMessage = errors.New("txproducer: invalid message")
	// ErrPayloadTooLarge: the payload exceeds MaxPayloadBytes (also wraps
	// ErrInvalidMessage). Nothing was sent. Do not retry. It is
	// wire.ErrPayloadTooLarge, the error outbox.Enqueue returns for the same
	// limit, so one errors.Is test serves both.
	ErrPayloadTooLarge = wire.ErrPayloadTooLarge
	// ErrNotStarted: Send before Start. Do not retry.
	ErrNotStarted = errors.New("txproducer: not started")
	// ErrClosed: Send or Start after Shutdown. Do not retry.
	ErrClosed = errors.New("txproducer: shut down")
	// ErrSend: the half message could not be stored by the broker, or was
	// stored but the client did not run the local transaction (then it is
	// ErrForcedRollback). Nothing committed. Retry with the same event id:
	// a half stored under it is answered ROLLBACK once another half commits
	// the id.
	ErrSend = errors.New("txproducer: send half message")
	// ErrForcedRollback (wraps ErrSend): the broker stored the half but
	// answered FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE (a SYNC_MASTER
	// whose slave is down or behind) or FLUSH_DISK_TIMEOUT (SYNC_FLUSH with
	// a slow disk), and the RocketMQ client then ended the half with
	// ROLLBACK itself, without running the local transaction. The error
	// names the status. Nothing committed: the function did not run, no
	// txlog row was written (the transaction begun early for it is rolled
	// back), the half is rolled back (if that one-way ROLLBACK is lost, a
	// check answers ROLLBACK from the missing row once past FenceAge).
	// Retry with the same event id, after a backoff: every Send to that
	// broker fails this way until its slave (or disk) catches up. It is
	// counted as result "forced_rollback" in the producer's sends metric.
	ErrForcedRollback = fmt.Errorf("%w: rolled back by the client on the broker's status", ErrSend)
	// ErrDatabase: the database failed before the local transaction could
	// commit. Nothing committed. Retry with the same event id.
	ErrDatabase = errors.New("txproducer: database")
	// ErrLocalTx: the caller's function returned an error or panicked; the
	// transaction was rolled back. errors.Is/As reach the cause. Whether to
	// try again is the caller's call (a business rule may refuse again);
	// if it does, it sends the same event id, and RetryAdvice says so.
	ErrLocalTx = errors.New("txproducer: local transaction failed")
	// ErrFenced: this Send's half was answered ROLLBACK before its local
	// transaction could take the id (a check or recovery fenced it while
	// it waited, or the id's row was written before rmqtx recorded halves,
	// which keeps it final). Nothing committed under this Send. A new Send
	// with the same id may commit it (RetryWithSameID), except for an id
	// whose row names no half.
	ErrFenced = errors.New("txproducer: event id already rolled back")
	// ErrEventIDConflict: the event id was committed earlier with a
	// different payload. Nothing new committed. Do not retry: two events
	// share an id (invariant I5).
	ErrEventIDConflict = errors.New("txproducer: event id committed with a different payload")
	// ErrCommitUnknown: COMMIT returned an error and the outcome could not
	// be read back. The txlog decides. Retry with the SAME event id
	// (Result.EventID): the retry learns the outcome without a second copy;
	// a committed event comes back as State Committed with Duplicate set,
	// one that did not commit is committed by the retry.
	ErrCommitUnknown = errors.New("txproducer: commit outcome unknown")
)

// PanicError is the cause inside ErrLocalTx when the caller's function
// panicked.
type PanicError struct {
	Value any
	Stack []byte
}

// Error formats Value through the log scrubber: the value may be the
// message or the payload the function was working on, and this text reaches
// logs and spans. Value itself is the caller's, as it was.
func (e *PanicError) Error() string {
	return fmt.Sprintf("txproducer: local transaction panicked: %v", rmqlog.ScrubValue(e.Value))
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
	// RetryWithNewID: the event id is spent, a Send with a new event id
	// may succeed. Only for an id whose rollback was recorded by a version
	// of rmqtx that did not name halves (ErrFenced): such a row stays
	// final. A failed Send of this version does not spend its id.
	RetryWithNewID
	// RetryWithSameID: nothing committed, or the outcome is unknown; Send
	// again with the same event id (Result.EventID). A committed outcome
	// comes back as Duplicate with no second copy; otherwise the caller's
	// function runs again and may commit the id.
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

// RetryAdvice classifies a Send error: RetryWithSameID for ErrCommitUnknown,
// ErrSend (ErrForcedRollback included: nothing committed, and the same id
// commits once the broker's slave is back), ErrDatabase, ErrFenced and
// ErrLocalTx (the caller's function failed: whether to run it again is the
// caller's call, but a retry takes the same id), RetryWithNewID for the ErrFenced of an id rolled back by an
// earlier rmqtx that did not name halves (its row stays final), DontRetry
// for everything else (an invalid message or config, an id committed with
// another payload, a closed producer), nil included. A retry loop decides
// about the caller's own refusals itself: errors.Is(err, ErrLocalTx) &&
// !IsRetryable(err) is a refusal ("out of stock") that sending again
// unchanged would repeat.
//
// Two kinds of error are DontRetry whatever they wrap. An error that is not
// a Send's: ErrStart (ErrDatabaseUnreachable, ErrNameServerUnreachable)
// and ErrConfig involve no event id; what helps is fixing the setup and
// calling Start again. And an ErrSend whose cause is a broker answer that
// sending again cannot change by itself: a topic that does not exist
// (CODE 17: an operator creates it, then the Send may be repeated), no
// permission (16), a message the broker refuses (13). Broker answers are
// classified by one table that the outbox, replay and discard recovery
// share (internal/broker/brokerclass).
func RetryAdvice(err error) Advice {
	switch {
	case err == nil:
		return DontRetry
	case errors.Is(err, ErrStart), errors.Is(err, ErrConfig):
		return DontRetry
	case errors.Is(err, ErrSend) && brokerRefusal(err):
		return DontRetry
	case errors.Is(err, errFinalRollback):
		return RetryWithNewID
	case errors.Is(err, ErrCommitUnknown), errors.Is(err, ErrSend), errors.Is(err, ErrDatabase),
		errors.Is(err, ErrFenced), errors.Is(err, ErrLocalTx):
		return RetryWithSameID
	default:
		return DontRetry
	}
}

// IsRetryable reports whether sending again may succeed without changing
// the message: the failure was in the broker or the database (or the id was
// fenced, or the commit's outcome is unknown), not in the message or the
// caller's function. An ErrLocalTx is retryable only when the database
// rolled the transaction back (a deadlock, a serialization failure under
// REPEATABLE READ or SERIALIZABLE, a lock wait timeout): a business
// refusal is the caller's to judge. Retry with the same event id.
func IsRetryable(err error) bool {
	if errors.Is(err, ErrLocalTx) {
		return dialect.RolledBack(err)
	}
	return RetryAdvice(err) != DontRetry
}

// brokerRefusal reports whether err carries a broker answer that sending
// again cannot change by itself (internal/broker/brokerclass).
func brokerRefusal(err error) bool {
	a, ok := brokerclass.OfError(err)
	return ok && (a.Operator || a.Class == errclass.Permanent)
}

// txEnded adds to err, a failure of the local transaction's function or
// COMMIT, why the transaction's context had ended, if it had: LocalTxTimeout
// (errLocalTxTimeout, which wraps context.DeadlineExceeded) or the end of
// Send's ctx. A function that ignores ctx otherwise sees only "sql:
// transaction has already been committed or rolled back" at COMMIT.
func txEnded(ctx context.Context, c *call, err error) error {
	if ctx.Err() == nil && c.txCtx.Err() == nil {
		return err
	}
	cause := context.Cause(c.txCtx)
	switch {
	case c.ctx.Err() != nil:
		cause = fmt.Errorf("txproducer: Send's context ended during the local transaction: %w", context.Cause(c.ctx))
	case errors.Is(cause, errLocalTxTimeout):
	default:
		cause = errLocalTxTimeout
	}
	return fmt.Errorf("%w (%w)", err, cause)
}

// errFinalRollback is inside the ErrFenced of an id whose ROLLED_BACK row
// names no half (written before rmqtx recorded halves): no Send can take
// it over, so RetryAdvice says RetryWithNewID.
var errFinalRollback = errors.New("the rollback is final: its row names no half (an earlier rmqtx); use a new event id")

// Causes of the end of a local transaction's context (context.Cause).
var (
	errLocalTxTimeout = fmt.Errorf("txproducer: LocalTxTimeout reached after the half message was stored: %w", context.DeadlineExceeded)
	errSendEnded      = errors.New("txproducer: send ended")
)

func wrapf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}

// forcedRollback names a status of a stored half that makes the client end
// it with ROLLBACK without running the local transaction, and says what the
// broker meant by it; ok is false for any other status.
func forcedRollback(s broker.SendStatus) (name, why string, ok bool) {
	switch s {
	case broker.SendSlaveNotAvailable:
		return "SLAVE_NOT_AVAILABLE", "its synchronous slave is down or too far behind", true
	case broker.SendFlushSlaveTimeout:
		return "FLUSH_SLAVE_TIMEOUT", "its synchronous slave did not confirm the copy in time", true
	case broker.SendFlushDiskTimeout:
		return "FLUSH_DISK_TIMEOUT", "it did not flush the half to disk in time (SYNC_FLUSH)", true
	}
	return "", "", false
}
