package wire_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/wire"
)

func TestRoundTrip(t *testing.T) {
	e := wire.Envelope{
		EventID: wire.NewEventID(), EventType: "PaymentSucceeded", EventVersion: 2,
		AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 7,
		BusinessKey: "pay-1", Headers: map[string]string{"trace": "abc"},
	}
	require.NoError(t, e.Validate())
	props := e.Properties([]byte(`{"a":1}`))
	require.Equal(t, wire.Hash([]byte(`{"a":1}`)), props[wire.PropPayloadHash])
	got, err := wire.Decode(props)
	require.NoError(t, err)
	require.Equal(t, e, got)
}

// The format version and the event version are always on the wire, so a
// reader in another language never has to guess what absence means.
func TestAlwaysWritesFormatAndEventVersion(t *testing.T) {
	props := wire.Envelope{EventID: "e", EventType: "T"}.Properties([]byte("x"))
	require.Equal(t, map[string]string{
		wire.PropFormatVersion: "1",
		wire.PropEventID:       "e",
		wire.PropEventType:     "T",
		wire.PropEventVersion:  "0",
		wire.PropPayloadHash:   "2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881",
	}, props)
}

func TestEventIDsAreTimeOrdered(t *testing.T) {
	prev := wire.NewEventID()
	for i := 0; i < 1000; i++ {
		id := wire.NewEventID()
		require.Less(t, prev, id)
		prev = id
	}
}

func TestFormatVersion(t *testing.T) {
	base := func(v string) map[string]string {
		p := map[string]string{wire.PropEventID: "e", wire.PropEventType: "T"}
		if v != "-" {
			p[wire.PropFormatVersion] = v
		}
		return p
	}
	for _, v := range []string{"-", "1"} {
		_, err := wire.Decode(base(v))
		require.NoError(t, err, "format %q", v)
	}
	_, err := wire.Decode(base("2"))
	require.ErrorIs(t, err, wire.ErrUnsupportedFormat)
	require.ErrorIs(t, err, wire.ErrInvalid)
	require.Contains(t, err.Error(), "upgrade")
	for _, v := range []string{"", "0", "x", "-1"} {
		_, err := wire.Decode(base(v))
		require.ErrorIs(t, err, wire.ErrInvalid, "format %q", v)
		require.NotErrorIs(t, err, wire.ErrUnsupportedFormat)
	}
}

func TestUnknownPropertiesAreIgnored(t *testing.T) {
	e, err := wire.Decode(map[string]string{wire.PropEventID: "e", wire.PropEventType: "T",
		"RMQTX_SOMETHING_NEW": "x", "TRACE_ON": "true", "KEYS": "a b"})
	require.NoError(t, err)
	require.Equal(t, wire.Envelope{EventID: "e", EventType: "T"}, e)
}

func TestInvalid(t *testing.T) {
	cases := map[string]map[string]string{
		"missing id":     {wire.PropEventType: "T"},
		"missing type":   {wire.PropEventID: "x"},
		"bad version":    {wire.PropEventID: "x", wire.PropEventType: "T", wire.PropEventVersion: "v1"},
		"neg version":    {wire.PropEventID: "x", wire.PropEventType: "T", wire.PropEventVersion: "-1"},
		"bad agg ver":    {wire.PropEventID: "x", wire.PropEventType: "T", wire.PropAggregateType: "A", wire.PropAggregateID: "1", wire.PropAggregateVersion: "-"},
		"control char":   {wire.PropEventID: "x\x01y", wire.PropEventType: "T"},
		"long id":        {wire.PropEventID: strings.Repeat("x", wire.MaxIDLen+1), wire.PropEventType: "T"},
		"agg id no type": {wire.PropEventID: "x", wire.PropEventType: "T", wire.PropAggregateID: "1"},
		"version no agg": {wire.PropEventID: "x", wire.PropEventType: "T", wire.PropAggregateVersion: "3"},
	}
	for name, props := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := wire.Decode(props)
			require.Error(t, err)
			require.True(t, errors.Is(err, wire.ErrInvalid), err)
		})
	}
}

func TestNormalizeHash(t *testing.T) {
	h := wire.Hash([]byte("body"))
	require.Equal(t, h, wire.NormalizeHash(strings.ToUpper(h)))
	require.Equal(t, h, wire.NormalizeHash(h))
	require.NotEqual(t, h, wire.NormalizeHash(wire.Hash([]byte("other"))))
}

// Hash is the lower-case hex SHA-256 that other clients compute too
// (FIPS 180-2's test vectors).
func TestHashIsLowerHexSHA256(t *testing.T) {
	require.Equal(t, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", wire.Hash(nil))
	require.Equal(t, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", wire.Hash([]byte("abc")))
}

func TestKeys(t *testing.T) {
	require.Equal(t, []string{"id"}, wire.Keys(nil, "id"))
	in := []string{"order-1", "cust-9"}
	require.Equal(t, []string{"order-1", "cust-9", "id"}, wire.Keys(in, "id"))
	require.Equal(t, []string{"order-1", "cust-9"}, in, "the caller's slice is not changed")
	require.Equal(t, "id", wire.EventIDFromKeys(strings.Join(wire.Keys(in, "id"), wire.KeySeparator)))
	require.Equal(t, "", wire.EventIDFromKeys(""))
	require.Equal(t, "b", wire.EventIDFromKeys(" a  b "))
	require.Equal(t, []string{"a", "b"}, wire.SplitKeys(" a  b "))
}

// FuzzDecode: decoding arbitrary properties never panics, and whatever
// decodes re-encodes to an envelope that decodes to the same value.
func FuzzDecode(f *testing.F) {
	f.Add("id-1", "T", "1", "Order", "o-1", "3", "k", "h", "v", "1")
	f.Add("", "", "", "", "", "", "", "", "", "")
	f.Add("id\x01", "T\x02", "x", "A", "", "-1", "", "", "", "2")
	f.Fuzz(func(t *testing.T, id, typ, ver, aggType, aggID, aggVer, key, hk, hv, format string) {
		props := map[string]string{wire.PropEventID: id, wire.PropEventType: typ, wire.PropEventVersion: ver,
			wire.PropAggregateType: aggType, wire.PropAggregateID: aggID, wire.PropAggregateVersion: aggVer,
			wire.PropBusinessKey: key, wire.HeaderPrefix + hk: hv, wire.PropFormatVersion: format}
		e, err := wire.Decode(props)
		if err != nil {
			require.ErrorIs(t, err, wire.ErrInvalid)
			return
		}
		again, err := wire.Decode(e.Properties(nil))
		require.NoError(t, err)
		require.Equal(t, e, again)
	})
}
