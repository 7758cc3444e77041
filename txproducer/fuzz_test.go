package txproducer

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rmqtx/rmqtx/wire"
)

// FuzzMessageContract feeds Send's validation with arbitrary caller input.
// Nothing panics; a rejected message wraps ErrInvalidMessage; an accepted one
// is decodable downstream: its properties carry no RocketMQ separator
// (\x01, \x02), decode (as a consumer does) to exactly the envelope that was
// sent, and survive the JSON round trip through the txlog's properties column.
func FuzzMessageContract(f *testing.F) {
	f.Add("orders", "paid", "k1", "0190a1b2-0000-7000-8000-000000000001", "OrderPlaced", 1, "Order", "o-1", int64(2), "biz-1", "trace", "t-1", []byte(`{"n":1}`))
	f.Add("RMQ_SYS_TRANS_HALF_TOPIC", "a||b", "k 1", "", "", -1, "Order", "", int64(-1), "", "", "", []byte{})
	f.Add("t", "", "", "id\x01x", "T\x02", 0, "", "", int64(0), "\xff", "h\x00", "v", []byte("x"))
	f.Fuzz(func(t *testing.T, topic, tags, key, id, typ string, ver int, aggType, aggID string, aggVer int64, bizKey, hk, hv string, payload []byte) {
		m := Message{Topic: topic, Tags: tags, EventType: typ, EventVersion: ver, AggregateType: aggType, AggregateID: aggID,
			AggregateVersion: aggVer, BusinessKey: bizKey, Payload: payload}
		if key != "" {
			m.Keys = []string{key}
		}
		if hk != "" {
			m.Headers = map[string]string{hk: hv}
		}
		if id == "" {
			id = wire.NewEventID()
		}
		env := m.envelope(id)
		if err := validate(m, env, 1<<16); err != nil {
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("rejection does not wrap ErrInvalidMessage: %v", err)
			}
			return
		}
		props := env.Properties(m.Payload)
		for k, v := range props {
			if strings.ContainsAny(k, "\x01\x02") || strings.ContainsAny(v, "\x01\x02") {
				t.Fatalf("accepted property %q=%q contains a RocketMQ separator", k, v)
			}
		}
		got, err := wire.Decode(props)
		if err != nil {
			t.Fatalf("accepted message does not decode: %v", err)
		}
		if env.AggregateType == "" {
			// The wire carries an aggregate version only with an aggregate
			// (wire.Properties); without one it is unversioned.
			env.AggregateVersion = 0
		}
		if len(env.Headers) == 0 && len(got.Headers) == 0 {
			env.Headers, got.Headers = nil, nil
		}
		if !reflect.DeepEqual(got, env) {
			t.Fatalf("decoded %+v, sent %+v", got, env)
		}
		if props[wire.PropPayloadHash] != wire.Hash(m.Payload) {
			t.Fatal("payload hash property does not match the payload")
		}
		raw, err := json.Marshal(props)
		if err != nil {
			t.Fatal(err)
		}
		var back map[string]string
		if err := json.Unmarshal(raw, &back); err != nil || !reflect.DeepEqual(back, props) {
			t.Fatalf("properties do not survive the txlog JSON column: %v", err)
		}
	})
}
