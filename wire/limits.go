package wire

import (
	"errors"
	"fmt"
)

// MaxPayloadBytes is the largest payload rmqtx sends: the broker's default
// message limit (maxMessageSize, 4 MiB) less 64 KiB for the properties and
// the envelope. txproducer refuses a larger payload before anything is
// sent, and outbox.Enqueue before anything is written, so a payload the
// broker would refuse never commits (an outbox row that can never be sent
// would go DEAD and hold back its aggregate's later events).
const MaxPayloadBytes = 4<<20 - 64<<10

// ErrPayloadTooLarge is wrapped by every "payload over the limit" error of
// txproducer and outbox (txproducer.ErrPayloadTooLarge and
// outbox.ErrPayloadTooLarge are this value), so one errors.Is test serves
// both.
var ErrPayloadTooLarge = errors.New("wire: payload too large")

// CheckPayloadSize returns an error wrapping ErrPayloadTooLarge when payload
// is larger than limit bytes.
func CheckPayloadSize(payload []byte, limit int) error {
	if len(payload) > limit {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrPayloadTooLarge, len(payload), limit)
	}
	return nil
}
