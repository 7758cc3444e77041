package wire_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/rmqtx/rmqtx/wire"
)

// The properties rmqtx writes for an event, as a Java consumer sees them in
// MessageExt.getProperties().
func ExampleEnvelope_Properties() {
	e := wire.Envelope{
		EventID:   "0197a000-0000-7000-8000-000000000001",
		EventType: "OrderPlaced", AggregateType: "Order", AggregateID: "o-42", AggregateVersion: 3,
		BusinessKey: "o-42", Headers: map[string]string{"tenant": "acme"},
	}
	if err := e.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	props := e.Properties([]byte(`{"order":42}`))
	for _, k := range slices.Sorted(maps.Keys(props)) {
		fmt.Printf("%s=%s\n", k, props[k])
	}
	// Output:
	// RMQTX_AGG_ID=o-42
	// RMQTX_AGG_TYPE=Order
	// RMQTX_AGG_VERSION=3
	// RMQTX_BIZ_KEY=o-42
	// RMQTX_EVENT_ID=0197a000-0000-7000-8000-000000000001
	// RMQTX_EVENT_TYPE=OrderPlaced
	// RMQTX_EVENT_VERSION=0
	// RMQTX_FORMAT_VERSION=1
	// RMQTX_PAYLOAD_SHA256=54985dc3c12fada7a1b1db53cf23d3cbd4bcbe64e1cef95071e2073e2ceff4ed
	// rmqtx.h.tenant=acme
}

// Decoding what another client wrote: unknown properties are ignored, and a
// message from a newer format is refused rather than guessed at.
func ExampleDecode() {
	e, err := wire.Decode(map[string]string{
		"RMQTX_EVENT_ID": "order-42", "RMQTX_EVENT_TYPE": "OrderPlaced",
		"RMQTX_AGG_TYPE": "Order", "RMQTX_AGG_ID": "42", "RMQTX_AGG_VERSION": "2",
		"KEYS": "order-42", "TAGS": "OrderPlaced",
	})
	fmt.Println(e.EventID, e.EventType, e.AggregateVersion, err)

	_, err = wire.Decode(map[string]string{"RMQTX_FORMAT_VERSION": "2", "RMQTX_EVENT_ID": "x", "RMQTX_EVENT_TYPE": "T"})
	fmt.Println(err)
	// Output:
	// order-42 OrderPlaced 2 <nil>
	// wire: unsupported format version 2 (this reader knows up to 1; upgrade rmqtx)
}

// The event id is always the last message key; the caller's keys come first.
func ExampleKeys() {
	keys := wire.Keys([]string{"order-42"}, "0197a000-0000-7000-8000-000000000001")
	joined := strings.Join(keys, wire.KeySeparator) // the KEYS property
	fmt.Println(joined)
	fmt.Println(wire.EventIDFromKeys(joined))
	// Output:
	// order-42 0197a000-0000-7000-8000-000000000001
	// 0197a000-0000-7000-8000-000000000001
}

// A hash written in upper case by another client's hex encoder is the same
// hash.
func ExampleNormalizeHash() {
	body := []byte(`{"order":42}`)
	declared := strings.ToUpper(wire.Hash(body)) // e.g. Java's String.format("%02X")
	fmt.Println(wire.NormalizeHash(declared) == wire.Hash(body))
	// Output: true
}
