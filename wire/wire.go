package wire

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

// FormatVersion is the version of the wire format this package writes and
// the highest it reads. It changes only for a change that a reader of the
// previous version would misread; adding an optional property does not
// change it (readers ignore properties they do not know).
const FormatVersion = 1

// User properties of an rmqtx message. Values are UTF-8 text without control
// characters; numbers are decimal.
const (
	// PropFormatVersion is the wire format version ("1"). Always written.
	// Absent: format 1 (rmqtx before the property existed). Higher than
	// FormatVersion: the reader rejects the message (ErrUnsupportedFormat).
	PropFormatVersion = "RMQTX_FORMAT_VERSION"
	// PropEventID is the event id: the dedup identity. Required, at most
	// MaxIDLen bytes.
	PropEventID = "RMQTX_EVENT_ID"
	// PropEventType names the event (the consumer's route). Required, at most
	// MaxTypeLen bytes.
	PropEventType = "RMQTX_EVENT_TYPE"
	// PropEventVersion is the payload's schema version, an int >= 0. Always
	// written ("0" = unversioned); absent reads as 0.
	PropEventVersion = "RMQTX_EVENT_VERSION"
	// PropAggregateType and PropAggregateID name the aggregate the event
	// belongs to; both or neither.
	PropAggregateType = "RMQTX_AGG_TYPE"
	PropAggregateID   = "RMQTX_AGG_ID"
	// PropAggregateVersion is the aggregate's version after this event, an
	// int64 >= 0, only with an aggregate. > 0 turns on the consumer's
	// version guard; 0 or absent: unversioned.
	PropAggregateVersion = "RMQTX_AGG_VERSION"
	// PropBusinessKey is the business key (an order number, ...), at most
	// MaxKeyLen bytes. Optional.
	PropBusinessKey = "RMQTX_BIZ_KEY"
	// PropPayloadHash is Hash(body): lower-case hex SHA-256 of the message
	// body. Optional on read; when present, a body that does not match is
	// rejected. Readers compare it case-insensitively.
	PropPayloadHash = "RMQTX_PAYLOAD_SHA256"
	// PropReplayPrefix starts the properties a replay adds (operator, audit
	// id, ...).
	PropReplayPrefix = "RMQTX_REPLAY_"
	// HeaderPrefix starts the property name of every user header:
	// "rmqtx.h.tenant" carries header "tenant".
	HeaderPrefix = "rmqtx.h."
)

// RocketMQ's own message properties that the format relies on. Every client
// sets them through its API (Java: setTags, setKeys; the broker and client
// set UNIQ_KEY); they are listed for readers of raw properties.
const (
	// PropTags is the RocketMQ tag. rmqtx writes the event type here when the
	// caller sets no tag, so tag filters select events by type.
	PropTags = "TAGS"
	// PropKeys holds the message keys, separated by KeySeparator. rmqtx
	// writes the caller's keys first and the event id last (see Keys).
	PropKeys = "KEYS"
	// PropUniqKey is the client-generated message id (Java:
	// MessageClientIDSetter); a new one for every message object.
	PropUniqKey = "UNIQ_KEY"
	// KeySeparator separates the keys in PropKeys (Java:
	// MessageConst.KEY_SEPARATOR).
	KeySeparator = " "
)

// Limits enforced by Validate. They keep ids usable as primary keys and keys
// in RocketMQ's index.
const (
	MaxIDLen          = 64
	MaxTypeLen        = 128
	MaxKeyLen         = 128
	MaxHeaderValueLen = 4096
)

var (
	// ErrInvalid is wrapped by every validation or decoding error.
	ErrInvalid = errors.New("wire: invalid")
	// ErrUnsupportedFormat is wrapped (beside ErrInvalid) when a message
	// declares a format version newer than FormatVersion: a newer producer
	// wrote it, and this reader must be upgraded before it can read it.
	ErrUnsupportedFormat = errors.New("wire: unsupported format version")
)

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

// Hash returns the lower-case hex SHA-256 of a payload: the identity used for
// conflict detection (same id, different hash).
func Hash(payload []byte) string {
	sum := sha256.Sum256(payload)
	// Encoded on the stack: one allocation (the string), where
	// hex.EncodeToString takes two. It runs once per Send and per delivery.
	var buf [2 * sha256.Size]byte
	hex.Encode(buf[:], sum[:])
	return string(buf[:])
}

// NormalizeHash returns a declared payload hash in the form Hash writes
// (lower case), so that "AB12..." from another client's hex encoder matches.
func NormalizeHash(h string) string {
	for i := 0; i < len(h); i++ {
		if c := h[i]; c >= 'A' && c <= 'Z' {
			return strings.ToLower(h)
		}
	}
	return h
}

// Keys returns the message keys rmqtx writes: the caller's keys in order,
// then the event id, always last. Consumers of other clients find the id as
// the last key (EventIDFromKeys), and mqadmin queryMsgByKey finds the
// message by any of them.
func Keys(keys []string, eventID string) []string {
	out := make([]string, 0, len(keys)+1)
	out = append(out, keys...)
	return append(out, eventID)
}

// SplitKeys splits a PropKeys value into its keys (empty tokens dropped).
func SplitKeys(v string) []string {
	return strings.FieldsFunc(v, func(r rune) bool { return r == ' ' })
}

// EventIDFromKeys returns the last key of a PropKeys value: where rmqtx puts
// the event id. "" when there is no key.
func EventIDFromKeys(v string) string {
	ks := SplitKeys(v)
	if len(ks) == 0 {
		return ""
	}
	return ks[len(ks)-1]
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

// CheckText applies the rules every text field of the format follows: at
// most max bytes, valid UTF-8, no control characters (RocketMQ separates
// properties with \u0001 and \u0002). An empty value is an error only when
// required. field names the value in the error.
func CheckText(field, v string, max int, required bool) error {
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
		if r < 0x20 || r == 0x7f {
			return invalid("%s contains a control character", field)
		}
	}
	return nil
}

// Validate checks the envelope before anything is sent.
func (e Envelope) Validate() error {
	if err := CheckText("event id", e.EventID, MaxIDLen, true); err != nil {
		return err
	}
	if err := CheckText("event type", e.EventType, MaxTypeLen, true); err != nil {
		return err
	}
	if e.EventVersion < 0 {
		return invalid("event version %d is negative", e.EventVersion)
	}
	if err := CheckText("aggregate type", e.AggregateType, MaxTypeLen, false); err != nil {
		return err
	}
	if err := CheckText("aggregate id", e.AggregateID, MaxKeyLen, false); err != nil {
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
	if err := CheckText("business key", e.BusinessKey, MaxKeyLen, false); err != nil {
		return err
	}
	for k, v := range e.Headers {
		if err := CheckText("header name", k, MaxTypeLen, true); err != nil {
			return err
		}
		if err := CheckText("header "+k, v, MaxHeaderValueLen, false); err != nil {
			return err
		}
	}
	return nil
}

// formatVersion is PropFormatVersion's value, computed once.
var formatVersion = strconv.Itoa(FormatVersion)

// Properties encodes the envelope (plus the format version and the payload
// hash) as message properties. Call Validate first.
func (e Envelope) Properties(payload []byte) map[string]string {
	p := make(map[string]string, 8+len(e.Headers))
	p[PropFormatVersion] = formatVersion
	p[PropEventID] = e.EventID
	p[PropEventType] = e.EventType
	p[PropEventVersion] = strconv.Itoa(e.EventVersion)
	p[PropPayloadHash] = Hash(payload)
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

// CheckFormat reads PropFormatVersion: nil when it is absent or at most
// FormatVersion, an error wrapping ErrInvalid (and ErrUnsupportedFormat for
// a newer version) otherwise.
func CheckFormat(props map[string]string) error {
	v, ok := props[PropFormatVersion]
	if !ok {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return invalid("format version %q is not a positive number", clip(v, 16))
	}
	if n > FormatVersion {
		return formatError(n)
	}
	return nil
}

// formatError is a message in a newer format: it is both ErrInvalid and
// ErrUnsupportedFormat, and says so once.
type formatError int

func (e formatError) Error() string {
	return fmt.Sprintf("wire: unsupported format version %d (this reader knows up to %d; upgrade rmqtx)", int(e), FormatVersion)
}

func (e formatError) Unwrap() []error { return []error{ErrInvalid, ErrUnsupportedFormat} }

// Decode reads an envelope back from message properties. A message without
// an event id, with malformed numbers or with a newer format version is an
// error wrapping ErrInvalid: a consumer parks it instead of retrying it.
// Properties Decode does not know are ignored.
func Decode(props map[string]string) (Envelope, error) {
	if err := CheckFormat(props); err != nil {
		return Envelope{}, err
	}
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
			return Envelope{}, invalid("event version %q is not a number", clip(v, 32))
		}
		e.EventVersion = n
	}
	if v := props[PropAggregateVersion]; v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return Envelope{}, invalid("aggregate version %q is not a number", clip(v, 32))
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

// clip shortens a value quoted in an error (it came off the wire).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
