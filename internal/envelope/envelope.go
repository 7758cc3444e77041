// Package envelope is rmqtx's internal name for the wire format, which the
// public package wire owns and documents (WIRE.md). It re-exports wire's
// names so that every producer path (txproducer, outbox, replay, checkback)
// and the consumer keep one import and one definition of the format: a
// public package can be read by users of other clients and versioned, while
// this one stays where the rest of the module already imports it from.
package envelope

import "github.com/rmqtx/rmqtx/wire"

// Property names carried on every rmqtx message (see wire).
const (
	PropFormatVersion    = wire.PropFormatVersion
	PropEventID          = wire.PropEventID
	PropEventType        = wire.PropEventType
	PropEventVersion     = wire.PropEventVersion
	PropAggregateType    = wire.PropAggregateType
	PropAggregateID      = wire.PropAggregateID
	PropAggregateVersion = wire.PropAggregateVersion
	PropBusinessKey      = wire.PropBusinessKey
	PropPayloadHash      = wire.PropPayloadHash
	// PropReplayPrefix starts the properties a replay adds (operator, audit id, ...).
	PropReplayPrefix = wire.PropReplayPrefix
	// HeaderPrefix starts the property name of every user header.
	HeaderPrefix = wire.HeaderPrefix
)

// Limits enforced by Validate (see wire).
const (
	MaxIDLen   = wire.MaxIDLen
	MaxTypeLen = wire.MaxTypeLen
	MaxKeyLen  = wire.MaxKeyLen
)

// ErrInvalid is wrapped by every validation or decoding error.
var ErrInvalid = wire.ErrInvalid

// Envelope is the metadata that travels beside a payload.
type Envelope = wire.Envelope

// NewEventID returns a time-ordered (UUIDv7) id.
func NewEventID() string { return wire.NewEventID() }

// Hash returns the lower-case hex SHA-256 of a payload.
func Hash(payload []byte) string { return wire.Hash(payload) }

// NormalizeHash returns a declared payload hash in Hash's (lower-case) form.
func NormalizeHash(h string) string { return wire.NormalizeHash(h) }

// Decode reads an envelope back from message properties.
func Decode(props map[string]string) (Envelope, error) { return wire.Decode(props) }
