package envelope

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	e := Envelope{
		EventID: NewEventID(), EventType: "PaymentSucceeded", EventVersion: 2,
		AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 7,
		BusinessKey: "pay-1", Headers: map[string]string{"trace": "abc"},
	}
	require.NoError(t, e.Validate())
	props := e.Properties([]byte(`{"a":1}`))
	require.Equal(t, Hash([]byte(`{"a":1}`)), props[PropPayloadHash])
	got, err := Decode(props)
	require.NoError(t, err)
	require.Equal(t, e, got)
}

func TestEventIDsAreTimeOrdered(t *testing.T) {
	prev := NewEventID()
	for i := 0; i < 1000; i++ {
		id := NewEventID()
		require.Less(t, prev, id)
		prev = id
	}
}

func TestInvalid(t *testing.T) {
	cases := map[string]map[string]string{
		"missing id":     {PropEventType: "T"},
		"missing type":   {PropEventID: "x"},
		"bad version":    {PropEventID: "x", PropEventType: "T", PropEventVersion: "v1"},
		"bad agg ver":    {PropEventID: "x", PropEventType: "T", PropAggregateType: "A", PropAggregateID: "1", PropAggregateVersion: "-"},
		"control char":   {PropEventID: "x\x01y", PropEventType: "T"},
		"long id":        {PropEventID: strings.Repeat("x", MaxIDLen+1), PropEventType: "T"},
		"agg id no type": {PropEventID: "x", PropEventType: "T", PropAggregateID: "1"},
		"version no agg": {PropEventID: "x", PropEventType: "T", PropAggregateVersion: "3"},
	}
	for name, props := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Decode(props)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrInvalid), err)
		})
	}
}

// FuzzDecode: decoding arbitrary properties never panics, and whatever
// decodes re-encodes to an envelope that decodes to the same value.
func FuzzDecode(f *testing.F) {
	f.Add("id-1", "T", "1", "Order", "o-1", "3", "k", "h", "v")
	f.Add("", "", "", "", "", "", "", "", "")
	f.Add("id\x01", "T\x02", "x", "A", "", "-1", "", "", "")
	f.Fuzz(func(t *testing.T, id, typ, ver, aggType, aggID, aggVer, key, hk, hv string) {
		props := map[string]string{PropEventID: id, PropEventType: typ, PropEventVersion: ver,
			PropAggregateType: aggType, PropAggregateID: aggID, PropAggregateVersion: aggVer,
			PropBusinessKey: key, HeaderPrefix + hk: hv}
		e, err := Decode(props)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			return
		}
		again, err := Decode(e.Properties(nil))
		require.NoError(t, err)
		require.Equal(t, e, again)
	})
}
