package outbox

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/rmqtx/rmqtx/wire"
)

// Status is the state of an outbox row.
type Status string

// Row states. PENDING and RETRY rows are due at next_retry_at; SENDING rows
// belong to owner_token until lease_until; SENT and DEAD are terminal.
const (
	StatusPending Status = "PENDING"
	StatusSending Status = "SENDING"
	StatusSent    Status = "SENT"
	StatusRetry   Status = "RETRY"
	StatusDead    Status = "DEAD"
)

// Limits checked by Enqueue; they match the column sizes.
const (
	MaxDestinationLen = 128
	// MaxPayloadLen is wire.MaxPayloadBytes (4 MiB - 64 KiB), the limit
	// txproducer's Send applies: a larger payload would commit with the
	// business transaction and then be refused by the broker (CODE 13),
	// go DEAD and hold back its aggregate's later events. The column
	// (MEDIUMBLOB, bytea) holds more.
	MaxPayloadLen   = wire.MaxPayloadBytes
	maxErrorMessage = 512
	maxErrorCode    = 64
)

// Event is one outbox row as the caller writes it. The envelope fields travel
// with the message (see package wire); Destination says where the sink
// sends it (a topic for RocketMQSink, any name for a FuncSink).
type Event struct {
	// EventID is the stable id consumers deduplicate on and the idempotency
	// key of a command. Default: a new time-ordered id (UUIDv7). Supply it
	// yourself when the business operation may be retried.
	EventID string
	// EventType names the event contract, for example "PaymentSucceeded".
	// Required.
	EventType string
	// EventVersion is the contract version (0 when unversioned).
	EventVersion int
	// AggregateType and AggregateID name the business object; set both or
	// neither. Events of one aggregate are sent in AggregateVersion order.
	AggregateType string
	AggregateID   string
	// AggregateVersion orders the events of one aggregate.
	AggregateVersion int64
	// Destination is the topic (RocketMQSink) or sink-specific target.
	// Required, at most 128 bytes.
	Destination string
	// MessageKey is the business key: a RocketMQ key (beside the event id)
	// and the envelope's business key. Optional.
	MessageKey string
	// Payload is the message body, at most MaxPayloadLen (4 MiB - 64 KiB,
	// wire.MaxPayloadBytes: what the broker accepts by default). Keep
	// secrets out of it: rows are long-lived copies. It may be empty for a
	// FuncSink command that needs none; RocketMQSink refuses an empty one
	// (brokers refuse a message without a body), and the row goes DEAD at
	// once with error code "empty_payload".
	Payload []byte
	// Headers travel as user properties (wire.HeaderPrefix + name).
	Headers map[string]string
}

// Envelope returns the wire envelope of the event.
func (e Event) Envelope() wire.Envelope {
	return wire.Envelope{
		EventID:          e.EventID,
		EventType:        e.EventType,
		EventVersion:     e.EventVersion,
		AggregateType:    e.AggregateType,
		AggregateID:      e.AggregateID,
		AggregateVersion: e.AggregateVersion,
		BusinessKey:      e.MessageKey,
		Headers:          e.Headers,
	}
}

// Validate checks the event as Enqueue does (after the event id default).
// Errors wrap ErrInvalidEvent and, for envelope fields, wire.ErrInvalid.
func (e Event) Validate() error {
	if err := e.Envelope().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	if e.Destination == "" {
		return fmt.Errorf("%w: destination is required", ErrInvalidEvent)
	}
	if len(e.Destination) > MaxDestinationLen || !utf8.ValidString(e.Destination) {
		return fmt.Errorf("%w: destination must be valid UTF-8 of at most %d bytes", ErrInvalidEvent, MaxDestinationLen)
	}
	if err := wire.CheckPayloadSize(e.Payload, MaxPayloadLen); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidEvent, err)
	}
	return nil
}

// Row is an outbox row as stored, for inspection (Table.Get) and tooling.
type Row struct {
	Event
	Status           Status
	OwnerToken       string
	LeaseUntil       time.Time // zero when not SENDING
	RetryCount       int
	NextRetryAt      time.Time // when due; for SENT and DEAD, when it became so (retention reads it)
	LastErrorCode    string
	LastErrorMessage string
	CreatedAt        time.Time
	SentAt           time.Time // zero until SENT
	UpdatedAt        time.Time
}
