// Package rmqmsg names the rocketmq-client-go value types that appear in
// rmqtx's public API: the messages a push consumer or a transaction
// listener hands to checkback, consumer and discard, the message outbox
// and discard build for a send, a local-transaction answer, and a
// subscription's selector.
//
// They are aliases, so a *primitive.MessageExt from the client is a
// *rmqmsg.MessageExt and code written against either compiles unchanged.
// This package and internal/broker are the only library packages that
// import the client (internal/broker's imports_test.go enforces it); it
// holds names only, no behaviour.
package rmqmsg

import (
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
)

type (
	// Message is a message to send (primitive.Message).
	Message = primitive.Message
	// MessageExt is a message the broker delivered or asks about
	// (primitive.MessageExt).
	MessageExt = primitive.MessageExt
	// LocalTransactionState is the answer to a transaction check
	// (primitive.LocalTransactionState).
	LocalTransactionState = primitive.LocalTransactionState
	// MessageSelector selects a subscription's messages by tag or SQL92
	// (consumer.MessageSelector).
	MessageSelector = consumer.MessageSelector
)
