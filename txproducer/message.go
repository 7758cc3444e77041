package txproducer

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/wire"
)

// LocalTxFunc is the caller's part of the local transaction. It runs after
// the txlog row was inserted in tx and must use tx (not another connection)
// for the business writes that decide the event. Returning an error, or
// panicking, rolls everything back. ctx is Send's ctx bounded by
// LocalTxTimeout.
type LocalTxFunc func(ctx context.Context, tx *sqlx.Tx) error

// Message is one event to publish.
type Message struct {
	Topic string // required
	// Tags is the RocketMQ tag. Default: the event type, so tag filters in
	// any client select events by type (WIRE.md).
	Tags string
	// Keys are RocketMQ keys; the event id is always added as the last key
	// (wire.Keys), where WIRE.md documents it.
	Keys []string
	// EventID is the stable id. Empty: a new UUIDv7. Supply your own (up to
	// 64 bytes) to derive the id from a business key, so that duplicate
	// requests collapse into one event and a failed Send can be retried
	// with the same id (see RetryAdvice). A supplied id that already has a
	// txlog row still sends a half, which its local transaction rolls back
	// at its first statement: a committed id is reported as Duplicate, a
	// rolled-back one is taken over by this Send (see the package doc).
	EventID          string
	EventType        string // required
	EventVersion     int
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	BusinessKey      string
	Headers          map[string]string
	Payload          []byte // required, at most Config.MaxPayloadBytes
}

// State is the outcome of a Send.
type State int

// States.
const (
	// StateUnknown: the commit outcome could not be learned (ErrCommitUnknown).
	StateUnknown State = iota
	// StateCommitted: the local transaction committed; the event will be
	// delivered (by END_TRANSACTION, a check, or discard recovery).
	StateCommitted
	// StateRolledBack: nothing committed; the event will not be delivered
	// for this Send.
	StateRolledBack
	// StateNotSent: the Send stopped before anything was sent or written
	// (an invalid message, a nil function, a context already ended, a
	// producer not started or shut down). Nothing happened under the event
	// id: it is not spent.
	StateNotSent
)

func (s State) String() string {
	switch s {
	case StateCommitted:
		return "committed"
	case StateRolledBack:
		return "rolled_back"
	case StateNotSent:
		return "not_sent"
	default:
		return "unknown"
	}
}

// Result describes a Send.
type Result struct {
	EventID       string
	State         State
	MsgID         string // the half message's id (UNIQ_KEY); empty if not sent
	TransactionID string
	// Duplicate: the event id was already committed with the same payload,
	// by an earlier or a concurrent Send. State is StateCommitted and the
	// error nil; this Send did not run the function (or rolled its effects
	// back), and its own half message, if one was sent, was rolled back, so
	// the event is delivered once, by the half that committed it. This is
	// how a retry after ErrCommitUnknown learns that the event committed.
	Duplicate bool
}

const maxPropertiesLen = 32000 // RocketMQ encodes the properties length as a short

func checkToken(field, v string, max int) error {
	if len(v) > max {
		return wrapf(ErrInvalidMessage, "%s is %d bytes, more than %d", field, len(v), max)
	}
	if !utf8.ValidString(v) {
		return wrapf(ErrInvalidMessage, "%s is not valid UTF-8", field)
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return wrapf(ErrInvalidMessage, "%s contains a control character", field)
		}
	}
	return nil
}

// validate checks m against the producer's limits; env is the envelope
// with the event id assigned.
func validate(m Message, env wire.Envelope, maxPayload int) error {
	if err := rmqname.Topic(m.Topic); err != nil {
		return wrapf(ErrInvalidMessage, "topic %v", err)
	}
	if strings.HasPrefix(m.Topic, "RMQ_SYS_") || m.Topic == "TRANS_CHECK_MAX_TIME_TOPIC" || strings.HasPrefix(m.Topic, "%RETRY%") || strings.HasPrefix(m.Topic, "%DLQ%") {
		return wrapf(ErrInvalidMessage, "topic %q is a system topic", m.Topic)
	}
	if err := checkToken("tags", m.Tags, 128); err != nil {
		return err
	}
	if strings.Contains(m.Tags, "||") {
		return wrapf(ErrInvalidMessage, "tags must not contain \"||\"")
	}
	for _, k := range m.Keys {
		if k == "" || strings.Contains(k, " ") {
			return wrapf(ErrInvalidMessage, "key %q: keys are non-empty and contain no space", k)
		}
		if err := checkToken("key", k, wire.MaxKeyLen); err != nil {
			return err
		}
	}
	if len(m.Payload) == 0 {
		return wrapf(ErrInvalidMessage, "payload is empty")
	}
	if err := wire.CheckPayloadSize(m.Payload, maxPayload); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	if err := env.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	n := 0
	for k, v := range env.Properties(m.Payload) {
		n += len(k) + len(v) + 2
	}
	if n > maxPropertiesLen {
		return wrapf(ErrInvalidMessage, "properties (headers) take %d bytes, limit %d", n, maxPropertiesLen)
	}
	return nil
}

// tag is the tag Send writes: Tags, else the event type (WIRE.md), so that
// tag filters in any client select events by type. It is applied after
// validate: the tag rules (no "||") bind the caller's Tags, while a type
// that a tag expression cannot match still travels as its tag and is
// selected by "*".
func (m Message) tag() string {
	if m.Tags != "" {
		return m.Tags
	}
	return m.EventType
}

func (m Message) envelope(id string) wire.Envelope {
	return wire.Envelope{
		EventID: id, EventType: m.EventType, EventVersion: m.EventVersion,
		AggregateType: m.AggregateType, AggregateID: m.AggregateID, AggregateVersion: m.AggregateVersion,
		BusinessKey: m.BusinessKey, Headers: m.Headers,
	}
}
