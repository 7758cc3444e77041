package consumer

import (
	"errors"
	"fmt"
	"maps"

	"github.com/rmqtx/rmqtx/wire"
)

// IDSource says where an adopted message's event id comes from. WIRE.md
// compares them; in short, the id must be the same for every copy of one
// business event and different for two events, and only the producer's
// application decides that.
type IDSource int

const (
	// IDFromProperty takes the id from the user property Adoption.Property
	// (e.g. "orderId", or an idempotency key the producer sets). As good as
	// the producer's choice of value.
	IDFromProperty IDSource = iota + 1
	// IDFromKeys takes the id from the message keys (Java: setKeys, the key
	// argument of new Message(topic, tags, keys, body)), the key at
	// Adoption.Key. A business key (an order number) survives every kind of
	// resend, so it is the safest choice when one key names one event.
	IDFromKeys
	// IDFromUniqKey takes the client message id (UNIQ_KEY, Java:
	// MessageClientIDSetter). The client's own internal send retries and the
	// broker's redeliveries keep it, but an application that sends again
	// after a timeout builds a new message with a new UNIQ_KEY: that copy is
	// a new event for dedup. Use it only when nothing better is on the
	// message.
	IDFromUniqKey
)

func (s IDSource) String() string {
	switch s {
	case IDFromProperty:
		return "property"
	case IDFromKeys:
		return "keys"
	case IDFromUniqKey:
		return "uniq_key"
	}
	return fmt.Sprintf("IDSource(%d)", int(s))
}

// Adoption lets a consumer apply messages that another client wrote without
// rmqtx's envelope (no RMQTX_EVENT_ID), such as a Java TransactionMQProducer
// that sets a tag, a key and a JSON body. Set it on ProcessorConfig.Adopt
// for every message of the consumer, or on Route.Adopt for one event type
// (the route is found by RMQTX_EVENT_TYPE, else by the tag).
//
// Adoption never changes how an rmqtx message (one with RMQTX_EVENT_ID) is
// read, so one topic can carry both. An adopted message gets the same
// guarantees as an rmqtx event under the identity adoption gives it: dedup
// and conflicts (same id, another body hash) per group, the version guard
// when an aggregate version is mapped, classified retries and dead letters.
// Any RMQTX_* property the message does carry (type, aggregate, version,
// payload hash) is used as usual. A message that still has no usable id or
// type is parked as malformed data with an error that says what was
// missing, as any undecodable message is. Its dead letter stores the
// adopted id and type as RMQTX_EVENT_ID and RMQTX_EVENT_TYPE, so a replay
// keeps the identity whatever the id source.
type Adoption struct {
	// ID is where the event id comes from. Required.
	ID IDSource
	// Property names the user property for IDFromProperty.
	Property string
	// Key is the index of the key for IDFromKeys: 0 (the default) is the
	// first key, negative counts from the end (-1 is the last, where rmqtx
	// itself writes the event id).
	Key int
	// IDPrefix is put before the adopted id ("billing:" + "order-42"), to
	// keep apart producers whose keys may collide in one group. The whole
	// id is at most 64 bytes (wire.MaxIDLen).
	IDPrefix string
	// TypeFromTag takes the event type from the RocketMQ tag when the
	// message has no RMQTX_EVENT_TYPE.
	TypeFromTag bool
	// Type is the event type when neither RMQTX_EVENT_TYPE nor (with
	// TypeFromTag) a tag gives one. Optional.
	Type string
	// AggregateType, AggregateIDProperty and AggregateVersionProperty map
	// an aggregate onto the version guard when the message has no
	// RMQTX_AGG_* properties: the aggregate id and its version (a decimal
	// int64 >= 0) are read from the named user properties. A message that
	// lacks the id property is not an aggregate event; one that lacks the
	// version property is unversioned (no guard), as with rmqtx events.
	// AggregateType and AggregateIDProperty go together.
	AggregateType            string
	AggregateIDProperty      string
	AggregateVersionProperty string
}

// ErrNotIdentified is wrapped (with wire.ErrInvalid) when adoption finds no
// usable event id or type on a message; the message is parked as ErrMalformed.
var ErrNotIdentified = errors.New("consumer: adoption: message not identified")

func (a *Adoption) validate(where string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %sAdopt: %s", ErrConfig, where, fmt.Sprintf(format, args...))
	}
	switch a.ID {
	case IDFromProperty:
		if a.Property == "" {
			return bad("ID is IDFromProperty but Property is empty")
		}
	case IDFromKeys, IDFromUniqKey:
	default:
		return bad("ID: unknown IDSource %d (use IDFromProperty, IDFromKeys or IDFromUniqKey)", int(a.ID))
	}
	if len(a.IDPrefix) >= wire.MaxIDLen {
		return bad("IDPrefix is %d bytes; ids are at most %d", len(a.IDPrefix), wire.MaxIDLen)
	}
	if err := wire.CheckText("IDPrefix", a.IDPrefix, wire.MaxIDLen, false); err != nil {
		return bad("%v", err)
	}
	if err := wire.CheckText("Type", a.Type, wire.MaxTypeLen, false); err != nil {
		return bad("%v", err)
	}
	if (a.AggregateType == "") != (a.AggregateIDProperty == "") {
		return bad("AggregateType and AggregateIDProperty must be set together")
	}
	if a.AggregateVersionProperty != "" && a.AggregateType == "" {
		return bad("AggregateVersionProperty needs AggregateType and AggregateIDProperty")
	}
	if err := wire.CheckText("AggregateType", a.AggregateType, wire.MaxTypeLen, false); err != nil {
		return bad("%v", err)
	}
	return nil
}

// validateAdoption checks ProcessorConfig.Adopt and every Route.Adopt.
func (c ProcessorConfig) validateAdoption() error {
	if c.Adopt != nil {
		if err := c.Adopt.validate(""); err != nil {
			return err
		}
	}
	for t, r := range c.Routes {
		if r.Adopt != nil {
			if err := r.Adopt.validate(fmt.Sprintf("route %q: ", t)); err != nil {
				return err
			}
		}
	}
	return nil
}

// decode reads m's envelope: the wire format, or, for a message without
// RMQTX_EVENT_ID where an Adoption applies, the identity adoption gives it.
// An adopted message is returned with a copy of its properties that carries
// the adopted RMQTX_* values (m's map is not changed), so its dead letter and
// replay keep the identity. On error m is returned unchanged.
func (p *Processor) decode(m Message) (Message, wire.Envelope, error) {
	var a *Adoption
	if m.Properties[wire.PropEventID] == "" {
		a = p.adoptionFor(m.Properties)
	}
	if a == nil {
		env, err := wire.Decode(m.Properties)
		return m, env, err
	}
	props, err := a.identify(m.Properties)
	if err != nil {
		return m, wire.Envelope{}, err
	}
	env, err := wire.Decode(props)
	if err != nil {
		return m, wire.Envelope{}, fmt.Errorf("adopted by %s: %w", a.ID, err)
	}
	m.Properties = props
	return m, env, nil
}

// adoptionFor picks the Adoption for a message without an event id: the
// route's (by RMQTX_EVENT_TYPE, else by tag), else the consumer's.
func (p *Processor) adoptionFor(props map[string]string) *Adoption {
	typ := props[wire.PropEventType]
	if typ == "" {
		typ = props[wire.PropTags]
	}
	if r, ok := p.cfg.Routes[typ]; ok && r.Adopt != nil {
		return r.Adopt
	}
	return p.cfg.Adopt
}

func notIdentified(format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", wire.ErrInvalid, ErrNotIdentified, fmt.Sprintf(format, args...))
}

// identify returns a copy of props with the adopted RMQTX_* values set.
func (a *Adoption) identify(props map[string]string) (map[string]string, error) {
	var id string
	switch a.ID {
	case IDFromProperty:
		id = props[a.Property]
		if id == "" {
			return nil, notIdentified("no %s and no property %q to take the event id from", wire.PropEventID, a.Property)
		}
	case IDFromKeys:
		keys := wire.SplitKeys(props[wire.PropKeys])
		i := a.Key
		if i < 0 {
			i += len(keys)
		}
		if len(keys) == 0 {
			return nil, notIdentified("no %s and no message keys to take the event id from", wire.PropEventID)
		}
		if i < 0 || i >= len(keys) {
			return nil, notIdentified("no %s and no key at index %d (the message has %d keys)", wire.PropEventID, a.Key, len(keys))
		}
		id = keys[i]
	case IDFromUniqKey:
		id = props[wire.PropUniqKey]
		if id == "" {
			return nil, notIdentified("no %s and no %s to take the event id from", wire.PropEventID, wire.PropUniqKey)
		}
	}
	out := maps.Clone(props)
	out[wire.PropEventID] = a.IDPrefix + id
	if out[wire.PropEventType] == "" {
		typ := a.Type
		if t := props[wire.PropTags]; a.TypeFromTag && t != "" {
			typ = t
		}
		if typ == "" {
			if a.TypeFromTag {
				return nil, notIdentified("no %s and no tag to take the event type from", wire.PropEventType)
			}
			return nil, notIdentified("no %s (set Adoption.TypeFromTag or Adoption.Type)", wire.PropEventType)
		}
		out[wire.PropEventType] = typ
	}
	if a.AggregateType != "" && props[wire.PropAggregateType] == "" {
		if aggID := props[a.AggregateIDProperty]; aggID != "" {
			out[wire.PropAggregateType] = a.AggregateType
			out[wire.PropAggregateID] = aggID
			if a.AggregateVersionProperty != "" {
				out[wire.PropAggregateVersion] = props[a.AggregateVersionProperty]
			}
		}
	}
	if out[wire.PropBusinessKey] == "" {
		// The first key is the business key of a natural producer (an
		// order number): kept for inspect and dead letters when it fits.
		if keys := wire.SplitKeys(props[wire.PropKeys]); len(keys) > 0 && wire.CheckText("", keys[0], wire.MaxKeyLen, true) == nil {
			out[wire.PropBusinessKey] = keys[0]
		}
	}
	return out, nil
}
