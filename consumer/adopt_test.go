package consumer

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/wire"
)

// natural builds a message as a Java producer written the natural way
// delivers it: tag, keys, a client message id and a body, no RMQTX_*.
func natural(tag, keys, uniq, body string, extra map[string]string) Message {
	props := map[string]string{wire.PropUniqKey: uniq}
	if tag != "" {
		props[wire.PropTags] = tag
	}
	if keys != "" {
		props[wire.PropKeys] = keys
	}
	maps.Copy(props, extra)
	return Message{Body: []byte(body), Properties: props, Delivery: Delivery{Topic: "t", MsgID: uniq, StoredAt: time.Now().UTC()}}
}

func TestAdoptionIdentify(t *testing.T) {
	base := map[string]string{wire.PropTags: "OrderPlaced", wire.PropKeys: "order-42 cust-7", wire.PropUniqKey: "7F000001ABCD", "orderId": "42"}
	cases := []struct {
		name string
		a    Adoption
		want map[string]string // RMQTX_* values expected in the result
	}{
		{"first key", Adoption{ID: IDFromKeys, TypeFromTag: true},
			map[string]string{wire.PropEventID: "order-42", wire.PropEventType: "OrderPlaced", wire.PropBusinessKey: "order-42"}},
		{"last key", Adoption{ID: IDFromKeys, Key: -1, TypeFromTag: true},
			map[string]string{wire.PropEventID: "cust-7", wire.PropEventType: "OrderPlaced", wire.PropBusinessKey: "order-42"}},
		{"property and prefix", Adoption{ID: IDFromProperty, Property: "orderId", IDPrefix: "shop:", Type: "Fixed"},
			map[string]string{wire.PropEventID: "shop:42", wire.PropEventType: "Fixed", wire.PropBusinessKey: "order-42"}},
		{"uniq key, tag wins over Type", Adoption{ID: IDFromUniqKey, TypeFromTag: true, Type: "Fixed"},
			map[string]string{wire.PropEventID: "7F000001ABCD", wire.PropEventType: "OrderPlaced", wire.PropBusinessKey: "order-42"}},
		{"aggregate mapped", Adoption{ID: IDFromKeys, TypeFromTag: true, AggregateType: "Order", AggregateIDProperty: "orderId", AggregateVersionProperty: "v"},
			map[string]string{wire.PropEventID: "order-42", wire.PropAggregateType: "Order", wire.PropAggregateID: "42", wire.PropAggregateVersion: ""}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := maps.Clone(base)
			out, err := tc.a.identify(in)
			require.NoError(t, err)
			require.Equal(t, base, in, "the delivered properties are not changed")
			for k, v := range tc.want {
				require.Equal(t, v, out[k], k)
			}
			_, err = wire.Decode(out)
			require.NoError(t, err)
		})
	}

	// What the message itself says wins over the adoption's defaults.
	own := maps.Clone(base)
	own[wire.PropEventType] = "OrderPaid"
	own[wire.PropAggregateType], own[wire.PropAggregateID], own[wire.PropAggregateVersion] = "Cart", "c-1", "5"
	out, err := (&Adoption{ID: IDFromKeys, TypeFromTag: true, AggregateType: "Order", AggregateIDProperty: "orderId"}).identify(own)
	require.NoError(t, err)
	require.Equal(t, "OrderPaid", out[wire.PropEventType])
	require.Equal(t, []string{"Cart", "c-1", "5"}, []string{out[wire.PropAggregateType], out[wire.PropAggregateID], out[wire.PropAggregateVersion]})

	fails := []struct {
		name, want string
		a          Adoption
		props      map[string]string
	}{
		{"no keys", "no message keys", Adoption{ID: IDFromKeys, TypeFromTag: true}, map[string]string{wire.PropTags: "T"}},
		{"key index", "no key at index 2 (the message has 1 keys)", Adoption{ID: IDFromKeys, Key: 2, TypeFromTag: true}, map[string]string{wire.PropTags: "T", wire.PropKeys: "k"}},
		{"no property", `no property "orderId"`, Adoption{ID: IDFromProperty, Property: "orderId", TypeFromTag: true}, map[string]string{wire.PropTags: "T"}},
		{"no uniq key", "no UNIQ_KEY", Adoption{ID: IDFromUniqKey, TypeFromTag: true}, map[string]string{wire.PropTags: "T"}},
		{"no tag", "no tag to take the event type from", Adoption{ID: IDFromKeys, TypeFromTag: true}, map[string]string{wire.PropKeys: "k"}},
		{"no type source", "set Adoption.TypeFromTag or Adoption.Type", Adoption{ID: IDFromKeys}, map[string]string{wire.PropKeys: "k", wire.PropTags: "T"}},
	}
	for _, tc := range fails {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.a.identify(tc.props)
			require.ErrorIs(t, err, ErrNotIdentified)
			require.ErrorIs(t, err, wire.ErrInvalid)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func TestAdoptionConfig(t *testing.T) {
	cases := map[string]struct {
		a    Adoption
		want string
	}{
		"no source":      {Adoption{}, "Adopt: ID: unknown IDSource 0"},
		"no property":    {Adoption{ID: IDFromProperty}, "Adopt: ID is IDFromProperty but Property is empty"},
		"long prefix":    {Adoption{ID: IDFromKeys, IDPrefix: strings.Repeat("p", 64)}, "Adopt: IDPrefix is 64 bytes"},
		"agg half":       {Adoption{ID: IDFromKeys, AggregateType: "Order"}, "AggregateType and AggregateIDProperty must be set together"},
		"version no agg": {Adoption{ID: IDFromKeys, AggregateVersionProperty: "v"}, "AggregateVersionProperty needs AggregateType"},
		"bad type":       {Adoption{ID: IDFromKeys, Type: "a\x01"}, "Adopt: wire: invalid: Type contains a control character"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := tc.a
			_, err := NewProcessor(ProcessorConfig{Group: "g", DB: idleDB(), Routes: map[string]Route{"T": {Handler: effectHandler}}, Adopt: &a})
			require.ErrorIs(t, err, ErrConfig)
			require.ErrorContains(t, err, tc.want)
			_, err = NewProcessor(ProcessorConfig{Group: "g", DB: idleDB(), Routes: map[string]Route{"T": {Handler: effectHandler, Adopt: &a}}})
			require.ErrorIs(t, err, ErrConfig)
			require.ErrorContains(t, err, `route "T": Adopt:`)
		})
	}
	_, err := NewProcessor(ProcessorConfig{Group: "g", DB: idleDB(), Routes: map[string]Route{"T": {Handler: effectHandler}},
		Adopt: &Adoption{ID: IDFromKeys, TypeFromTag: true}})
	require.NoError(t, err)
}

// TestAdoptedProcess: a natural message is applied once under the identity
// adoption gives it, with dedup, conflicts, the version guard and dead
// letters working as for rmqtx events; without adoption it is parked as
// before.
func TestAdoptedProcess(t *testing.T) {
	t.Parallel()
	eachDB(t, testAdoptedProcess)
}

func testAdoptedProcess(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()

	// Without adoption: parked as malformed, the handler never runs.
	off := newProc(t, db, nil)
	o := off.Process(ctx, natural("Created", "order-1", "U1", `{"n":1}`, nil))
	require.Equal(t, ResultParked, o.Result)
	require.ErrorIs(t, o.Err, ErrMalformed)
	require.ErrorContains(t, o.Err, "event id is required")

	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Adopt = &Adoption{ID: IDFromKeys, TypeFromTag: true}
		c.Routes["Moved"] = Route{Handler: effectHandler, Adopt: &Adoption{ID: IDFromProperty, Property: "moveId", IDPrefix: "mv:",
			TypeFromTag: true, AggregateType: "Box", AggregateIDProperty: "box", AggregateVersionProperty: "seq"}}
	})
	o = p.Process(ctx, natural("Created", "order-1", "U1", `{"n":1}`, nil))
	require.Equal(t, ResultApplied, o.Result, o.Err)
	require.Equal(t, "order-1", o.EventID)
	// The producer sent it again after a timeout: a new message, new
	// UNIQ_KEY, same business key and body.
	o = p.Process(ctx, natural("Created", "order-1", "U2", `{"n":1}`, nil))
	require.Equal(t, ResultDuplicate, o.Result)
	// Same key, another body: a conflict, parked with both hashes.
	o = p.Process(ctx, natural("Created", "order-1", "U3", `{"n":2}`, nil))
	require.Equal(t, ResultConflict, o.Result)
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM effect WHERE event_id = 'order-1'"))

	// A declared payload hash in upper case is the same hash.
	body := `{"n":3}`
	o = p.Process(ctx, natural("Created", "order-3", "U4", body, map[string]string{wire.PropPayloadHash: strings.ToUpper(wire.Hash([]byte(body)))}))
	require.Equal(t, ResultApplied, o.Result, o.Err)
	o = p.Process(ctx, natural("Created", "order-4", "U5", body, map[string]string{wire.PropPayloadHash: strings.ToUpper(wire.Hash([]byte("other")))}))
	require.Equal(t, ResultParked, o.Result)
	require.ErrorContains(t, o.Err, "does not match the declared")

	// Per-route adoption with the aggregate mapped: the version guard holds
	// (strict: v2 before v1 waits, v1 applies, then v2, a stale v1 is skipped).
	mv := func(id, seq string) Message {
		return natural("Moved", "", "u-"+id, "move "+id, map[string]string{"moveId": id, "box": "b1", "seq": seq})
	}
	o = p.Process(ctx, mv("2", "2"))
	require.Equal(t, ResultRetry, o.Result)
	require.ErrorIs(t, o.Err, ErrVersionGap)
	require.Equal(t, ResultApplied, p.Process(ctx, mv("1", "1")).Result)
	require.Equal(t, ResultApplied, p.Process(ctx, mv("2", "2")).Result)
	require.Equal(t, ResultStale, p.Process(ctx, mv("1b", "1")).Result)
	var versions []int64
	require.NoError(t, db.Select(&versions, "SELECT version FROM effect WHERE agg_id = 'b1' ORDER BY id"))
	require.Equal(t, []int64{1, 2}, versions)
	var ids []string
	require.NoError(t, db.Select(&ids, "SELECT event_id FROM effect WHERE agg_id = 'b1' ORDER BY id"))
	require.Equal(t, []string{"mv:1", "mv:2"}, ids, "the route's adoption, with its prefix")

	// Still unidentifiable: parked with a clear error, the handler not run.
	o = p.Process(ctx, natural("Created", "", "U9", `{"n":9}`, nil))
	require.Equal(t, ResultParked, o.Result)
	require.ErrorIs(t, o.Err, ErrMalformed)
	require.ErrorIs(t, o.Err, ErrNotIdentified)
	require.ErrorContains(t, o.Err, "no message keys to take the event id from")
	require.Equal(t, "msgid:U9", o.EventID)

	// The dead letter of an adopted message keeps the adopted identity, so a
	// replay of it is the same event whatever the id source.
	u := newProc(t, db, func(c *ProcessorConfig) { c.Adopt = &Adoption{ID: IDFromUniqKey, TypeFromTag: true} })
	o = u.Process(ctx, natural("Nope", "k", "UQ1", `{}`, nil))
	require.Equal(t, ResultParked, o.Result)
	require.ErrorIs(t, o.Err, ErrUnknownEventType)
	dl, err := u.DeadLetters().Get(ctx, o.DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, "UQ1", dl.EventID)
	require.Equal(t, "UQ1", dl.Properties[wire.PropEventID])
	require.Equal(t, "Nope", dl.Properties[wire.PropEventType])
	require.Equal(t, "k", dl.Properties[wire.PropKeys])
}
