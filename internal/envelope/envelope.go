// Package envelope defines rmqtx's wire contract on top of a RocketMQ message:
// which user properties carry the event id, type, version, aggregate and
// headers, how event ids are generated, and how payloads are hashed. Every
// producer path (txproducer, outbox, replay) encodes with it and every consumer
// decodes with it, so the format lives in exactly one place.
package envelope

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Property names carried on every rmqtx message.
const (
	PropEventID          = "RMQTX_EVENT_ID"
	PropEventType        = "RMQTX_EVENT_TYPE"
	PropEventVersion     = "RMQTX_EVENT_VERSION"
	PropAggregateType    = "RMQTX_AGG_TYPE"
	PropAggregateID      = "RMQTX_AGG_ID"
	PropAggregateVersion = "RMQTX_AGG_VERSION"
	PropBusinessKey      = "RMQTX_BIZ_KEY"
	PropPayloadHash      = "RMQTX_PAYLOAD_SHA256"
	// PropReplayPrefix starts the properties a replay adds (operator, audit id, ...).
	PropReplayPrefix = "RMQTX_REPLAY_"
	// HeaderPrefix starts the property name of every user header.
	HeaderPrefix = "rmqtx.h."
)

// Limits enforced by Validate. They keep ids usable as primary keys and keys
// in RocketMQ's index.
const (
	MaxIDLen   = 64
	MaxTypeLen = 128
	MaxKeyLen  = 128
)

// ErrInvalid is wrapped by every validation or decoding error.
var ErrInvalid = errors.New("envelope: invalid")

// Envelope is the metadata that travels beside a payload.
type Envelope struct {
	EventID          string
	EventType        string
	EventVersion     int
	AggregateType    string
	AggregateID      string
	AggregateVersion int64
	BusinessKey      string
	Headers          map[string]string
}

// NewEventID returns a time-ordered (UUIDv7) id, so ids sort by creation time
// and index well as primary keys.
func NewEventID() string {
	id, err := uuid.NewV7()
	if err != nil {
		// NewV7 only fails when the random source fails; fall back to v4,
		// which uses the same source and reports the same way.
		return uuid.NewString()
	}
	return id.String()
}

// Hash returns the hex SHA-256 of a payload: the identity used for conflict
// detection (same id, different hash).
func Hash(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:])
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func checkText(field, v string, max int, required bool) error {
	if v == "" {
		if required {
			return invalid("%s is required", field)
		}
		return nil
	}
	if len(v) > max {
		return invalid("%s is %d bytes, more than %d", field, len(v), max)
	}
	if !utf8.ValidString(v) {
		return invalid("%s is not valid UTF-8", field)
	}
	for _, r := range v {
		// \u0001 and \u0002 are RocketMQ's property separators.
		if r < 0x20 || r == 0x7f {
			return invalid("%s contains a control character", field)
		}
	}
	return nil
}

// Validate checks the envelope before anything is sent.
func (e Envelope) Validate() error {
	if err := checkText("event id", e.EventID, MaxIDLen, true); err != nil {
		return err
	}
	if err := checkText("event type", e.EventType, MaxTypeLen, true); err != nil {
		return err
	}
	if e.EventVersion < 0 {
		return invalid("event version %d is negative", e.EventVersion)
	}
	if err := checkText("aggregate type", e.AggregateType, MaxTypeLen, false); err != nil {
		return err
	}
	if err := checkText("aggregate id", e.AggregateID, MaxKeyLen, false); err != nil {
		return err
	}
	if e.AggregateVersion < 0 {
		return invalid("aggregate version %d is negative", e.AggregateVersion)
	}
	if (e.AggregateType == "") != (e.AggregateID == "") {
		return invalid("aggregate type and id must be set together")
	}
	if e.AggregateType == "" && e.AggregateVersion != 0 {
		// Properties carries the version only with its aggregate.
		return invalid("aggregate version %d without an aggregate", e.AggregateVersion)
	}
	if err := checkText("business key", e.BusinessKey, MaxKeyLen, false); err != nil {
		return err
	}
	for k, v := range e.Headers {
		if err := checkText("header name", k, MaxTypeLen, true); err != nil {
			return err
		}
		if err := checkText("header "+k, v, 4096, false); err != nil {
			return err
		}
	}
	return nil
}

// Properties encodes the envelope (plus the payload hash) as message
// properties. Call Validate first.
func (e Envelope) Properties(payload []byte) map[string]string {
	p := map[string]string{
		PropEventID:     e.EventID,
		PropEventType:   e.EventType,
		PropPayloadHash: Hash(payload),
	}
	if e.EventVersion != 0 {
		p[PropEventVersion] = strconv.Itoa(e.EventVersion)
	}
	if e.AggregateType != "" {
		p[PropAggregateType] = e.AggregateType
		p[PropAggregateID] = e.AggregateID
		p[PropAggregateVersion] = strconv.FormatInt(e.AggregateVersion, 10)
	}
	if e.BusinessKey != "" {
		p[PropBusinessKey] = e.BusinessKey
	}
	for k, v := range e.Headers {
		p[HeaderPrefix+k] = v
	}
	return p
}

// Decode reads an envelope back from message properties. A message without
// an event id, or with malformed numbers, is an error wrapping ErrInvalid:
// the consumer parks it as permanent instead of retrying it.
func Decode(props map[string]string) (Envelope, error) {
	e := Envelope{
		EventID:       props[PropEventID],
		EventType:     props[PropEventType],
		AggregateType: props[PropAggregateType],
		AggregateID:   props[PropAggregateID],
		BusinessKey:   props[PropBusinessKey],
	}
	if v := props[PropEventVersion]; v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return Envelope{}, invalid("event version %q is not a number", v)
		}
		e.EventVersion = n
	}
	if v := props[PropAggregateVersion]; v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Envelope{}, invalid("aggregate version %q is not a number", v)
		}
		e.AggregateVersion = n
	}
	for k, v := range props {
		if name, ok := strings.CutPrefix(k, HeaderPrefix); ok {
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers[name] = v
		}
	}
	if err := e.Validate(); err != nil {
		return Envelope{}, err
	}
	return e, nil
}
