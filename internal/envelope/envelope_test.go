package envelope

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/wire"
)

// The package is wire under its internal name: the same errors, the same
// encoding. The format itself is tested in package wire.
func TestIsWire(t *testing.T) {
	e := Envelope{EventID: NewEventID(), EventType: "T", AggregateType: "A", AggregateID: "1", AggregateVersion: 2}
	props := e.Properties([]byte("p"))
	require.Equal(t, wire.Envelope(e).Properties([]byte("p")), props)
	got, err := Decode(props)
	require.NoError(t, err)
	require.Equal(t, e, got)
	require.Equal(t, Hash([]byte("p")), props[PropPayloadHash])
	require.Equal(t, Hash([]byte("p")), NormalizeHash(wire.Hash([]byte("p"))))

	_, err = Decode(map[string]string{PropEventType: "T"})
	require.True(t, errors.Is(err, ErrInvalid) && errors.Is(err, wire.ErrInvalid), err)
}
