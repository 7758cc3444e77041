package consumer

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/wire"
)

// FuzzMessageDecode feeds the consumer's decoding path with arbitrary wire
// input: a body, the properties blob as RocketMQ encodes it (name \x01 value
// \x02 ...), a topic and a reconsume count. Nothing panics; a message either
// decodes to a valid envelope or fails with wire.ErrInvalid (and is
// parked under an id that fits the dead-letter table); the properties kept for
// a replay are a subset of the delivered ones and never carry rmqtx's own
// attempt counter.
func FuzzMessageDecode(f *testing.F) {
	ok := wire.Envelope{EventID: "0190a1b2-0000-7000-8000-000000000001", EventType: "OrderPlaced", EventVersion: 2,
		AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 3, BusinessKey: "k-1", Headers: map[string]string{"trace": "t-1"}}
	m := primitive.NewMessage("orders", nil)
	m.WithProperties(ok.Properties([]byte(`{"n":1}`)))
	m.WithKeys([]string{ok.EventID})
	f.Add([]byte(`{"n":1}`), m.MarshallProperties(), "orders", int32(0))
	f.Add([]byte("x"), "RMQTX_EVENT_ID\x01id\x02RMQTX_EVENT_TYPE\x01T\x02RMQTX_AGG_VERSION\x01-7\x02", "%RETRY%g", int32(3))
	f.Add([]byte{}, "RETRY_TOPIC\x01orders\x02RMQTX_RECONSUME_TIMES\x0199\x02RMQTX_EVENT_ID\x01\xff\xfe\x02", "%RETRY%g", int32(-1))
	f.Add([]byte("p"), "\x01\x02\x01\x01\x02rmqtx.h.\x01v\x02RMQTX_EVENT_VERSION\x019999999999999999999\x02", "", int32(0))
	f.Fuzz(func(t *testing.T, body []byte, props, topic string, reconsume int32) {
		ext := &primitive.MessageExt{Message: primitive.Message{Topic: topic, Body: body}, ReconsumeTimes: reconsume, MsgId: "m1"}
		ext.UnmarshalProperties([]byte(props))
		msg := MessageFromExt(ext)
		if msg.Delivery.ReconsumeTimes < int(reconsume) {
			t.Fatalf("reconsume times went down: %d < %d", msg.Delivery.ReconsumeTimes, reconsume)
		}
		if !strings.HasPrefix(topic, "%RETRY%") && msg.Delivery.Topic != topic {
			t.Fatalf("topic %q became %q", topic, msg.Delivery.Topic)
		}
		env, err := wire.Decode(msg.Properties)
		if err != nil {
			if !errors.Is(err, wire.ErrInvalid) {
				t.Fatalf("decode error does not wrap wire.ErrInvalid: %v", err)
			}
			ev := malformedEvent(msg)
			if ev.ID == "" || !utf8.ValidString(ev.ID) || len(ev.ID) > len("msgid:")+wire.MaxIDLen {
				t.Fatalf("malformed message parked under an unusable id %q", ev.ID)
			}
		} else {
			if env.EventID != msg.Properties[wire.PropEventID] {
				t.Fatalf("event id %q decoded as %q", msg.Properties[wire.PropEventID], env.EventID)
			}
			if err := env.Validate(); err != nil {
				t.Fatalf("decoded envelope does not validate: %v", err)
			}
		}
		kept := replayProperties(msg.Properties)
		if _, bad := kept[propReconsume]; bad {
			t.Fatal("the replay properties carry the attempt counter")
		}
		for k, v := range kept {
			if msg.Properties[k] != v {
				t.Fatalf("replay property %q=%q was not delivered as such", k, v)
			}
		}
	})
}
