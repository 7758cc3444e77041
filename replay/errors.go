package replay

import (
	"context"
	"errors"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
)

// sendFailure classifies the failed send of one dead letter with the
// vocabulary the consumer and the outbox share (errclass), for
// Item.ErrorClass and Item.ErrorCode:
//
//   - a broker's answer, as every sender reads it
//     (internal/broker/brokerclass): its class and name, e.g. Transient
//     "topic_not_exist" (create the topic), Permanent "message_illegal";
//   - a status other than SendOK: stored less durably than asked, Unknown;
//   - a context deadline: Unknown "timeout" (the message may have gone);
//   - an error already classified: its class and code;
//   - anything else: Unknown, errclass's fallback, kept on purpose. A replay
//     does not retry by itself: the dead letter stays PARKED and a later
//     replay may send it again, which the consumer's dedup absorbs whatever
//     happened to this send.
func sendFailure(err error) *errclass.Error {
	var se *broker.StatusError
	switch {
	case errors.As(err, &se):
		return errclass.Wrap(se.Answer.Class, se.Answer.Name, err)
	case errors.Is(err, broker.ErrNoSendResult):
		return errclass.Wrap(errclass.Unknown, "no_result", err)
	}
	if a, ok := brokerclass.OfError(err); ok {
		return errclass.Wrap(a.Class, a.Name, err)
	}
	if _, ok := errclass.Find(err); !ok && errors.Is(err, context.DeadlineExceeded) {
		return errclass.Wrap(errclass.Unknown, "timeout", err)
	}
	return errclass.Wrap(errclass.ClassOf(err), errclass.CodeOf(err), err)
}
