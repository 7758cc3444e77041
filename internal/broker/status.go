package broker

import (
	"errors"
	"fmt"

	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
)

// The one reading of a plain send's answer. The client reports a send in
// two parts: an error (the broker refused, or nothing came back) and, when
// there is none, a result whose status may still say that the broker stored
// the message less durably than asked (flush or slave timeout, slave not
// available). Every rmqtx sender (the consumer's re-send, discard recovery's
// republish, replay, the outbox sink, the tracing of a send) reads the
// second part here, so a status means the same thing everywhere; the answer
// to an error is brokerclass.OfError's.

// ErrNoSendResult is a send that returned neither an error nor a result.
// The client does not do that; a sender treats it as an unknown outcome
// rather than as a success it cannot prove.
var ErrNoSendResult = errors.New("broker: the client returned no send result")

// StatusError is a send the broker answered with a status other than
// SendOK: the message is stored, but not as durably as asked. Answer is the
// status's row of the broker-answer table (brokerclass.OfStatus).
type StatusError struct {
	Status SendStatus
	Answer brokerclass.Answer
}

// Error is "send status <n> (<name>)".
func (e *StatusError) Error() string {
	return fmt.Sprintf("send status %d (%s)", e.Status, e.Answer.Name)
}

// CheckSendResult is the answer of a send that returned no error: nil for a
// result with SendOK, ErrNoSendResult for no result, else a *StatusError.
func CheckSendResult(res *SendResult) error {
	if res == nil {
		return ErrNoSendResult
	}
	if a, failed := brokerclass.OfStatus(res.Status); failed {
		return &StatusError{Status: res.Status, Answer: a}
	}
	return nil
}

// SendOutcome names how a send ended, for a span or a log line: "" for a
// message stored with SendOK, "send" when the call failed (an error, or no
// result), "send_status" when the broker stored it with another status.
func SendOutcome(res *SendResult, err error) string {
	if err != nil {
		return "send"
	}
	var se *StatusError
	switch cerr := CheckSendResult(res); {
	case cerr == nil:
		return ""
	case errors.As(cerr, &se):
		return "send_status"
	default:
		return "send"
	}
}
