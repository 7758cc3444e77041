package broker

import (
	"context"
	"errors"
	"reflect"
)

// The client's SendMessageInTransaction always ends the transaction itself,
// one-way, with the listener's answer, and logs an ERROR carrying the whole
// message for any answer but COMMIT. A caller that ends the transaction
// itself (rmqtx's keyed Sends end their commits with a request the broker
// answers, to keep the order per key) then answers UNKNOWN, and the client
// still sends that UNKNOWN: the broker ignores it, but handles the request
// and writes a WARN line to its transaction log for every such Send
// ("end transaction in sending message, and it's pending status").
//
// SendHalf does the first half of SendMessageInTransaction (the two
// properties that make a half of the group, and the client's own SendSync,
// with its queue selector, interceptors and retries) and leaves the rest to
// the caller. The half is the same message the client would have sent; a
// check of it reaches the group's listener as before.
//
// Upstream lacks it (no upstream issue found): the client offers no way to
// send a half without ending it. The inner producer is reached as
// internalClient reaches the client (transactionProducer's field producer),
// and only its public SendSync is called. TestSendHalfFindsTheProducer fails
// when an upgrade changes that layout; rmqtx then falls back to
// SendMessageInTransaction (ErrNoHalfSend).

// ErrNoHalfSend is SendHalf's error when the client's layout differs:
// nothing was sent.
var ErrNoHalfSend = errors.New("broker: the client's producer is not reachable for a half send")

// syncSender is the client producer's synchronous send.
type syncSender interface {
	SendSync(ctx context.Context, msgs ...*Message) (*SendResult, error)
}

// halfSender returns the producer inside a transactional producer of the
// pinned client, or false when the layout differs.
func halfSender(tp any) (s syncSender, ok bool) {
	defer func() {
		if recover() != nil {
			s, ok = nil, false
		}
	}()
	inner := field(reflect.ValueOf(tp), "producer")
	if !inner.IsValid() || inner.Kind() != reflect.Pointer || inner.IsNil() {
		return nil, false
	}
	s, ok = inner.Interface().(syncSender)
	return s, ok
}
