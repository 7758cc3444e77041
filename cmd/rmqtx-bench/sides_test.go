package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/wire"
)

// The preloaded consumer messages and the check-back workload's halves
// carry what txproducer's messages carry: the envelope, the event type as
// tag and the id as key (the client's WithProperties replaces the map, so
// the order of the calls matters).
func TestEnvelopeMessageKeepsTagAndKeys(t *testing.T) {
	payload := makePayload(64, 1)
	m := envelopeMessage("bench_topic", "id-1", payload)
	require.Equal(t, benchEventType, m.GetTags())
	require.Equal(t, "id-1", m.GetKeys())
	require.Equal(t, "id-1", m.GetProperty(wire.PropEventID))
	require.Equal(t, benchEventType, m.GetProperty(wire.PropEventType))
	require.Equal(t, wire.Hash(payload), m.GetProperty(wire.PropPayloadHash))
}
