package discard_test

import (
	"reflect"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/wire"
)

// FuzzRepublishProperties feeds the properties blob of a discarded half
// message to RepublishProperties. Nothing panics; the properties of a
// re-published message keep the event's identity (they decode to the same
// envelope, or fail the same way), drop every transaction property, and
// add nothing.
func FuzzRepublishProperties(f *testing.F) {
	env := wire.Envelope{EventID: "0190a1b2-0000-7000-8000-000000000001", EventType: "OrderPlaced", BusinessKey: "k"}
	m := primitive.NewMessage(discard.Topic, nil)
	m.WithProperties(env.Properties([]byte("{}")))
	m.WithProperty(primitive.PropertyRealTopic, "orders")
	m.WithProperty(primitive.PropertyTransactionPrepared, "true")
	m.WithProperty(primitive.PropertyProducerGroup, "pg")
	m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, "u1")
	f.Add(m.MarshallProperties())
	f.Add("RMQTX_PROBE\x011\x02PGROUP\x01pg\x02")
	f.Add("REAL_TOPIC\x01\x02RMQTX_EVENT_ID\x01\x00\x02")
	f.Add("RMQTX_EVENT_ID\x01\xef\x870")
	f.Add("\x02\x02\x02\x02\x02\x02\x02")
	f.Fuzz(func(t *testing.T, props string) {
		ext := &primitive.MessageExt{Message: primitive.Message{Topic: discard.Topic}}
		ext.UnmarshalProperties([]byte(props))
		p := ext.GetProperties()
		out := discard.RepublishProperties(p)
		for _, k := range []string{primitive.PropertyTransactionPrepared, primitive.PropertyProducerGroup, primitive.PropertyRealTopic,
			primitive.PropertyRealQueueId, primitive.PropertyTransactionID} {
			if _, ok := out[k]; ok {
				t.Fatalf("re-published message keeps %s", k)
			}
		}
		for k, v := range out {
			if p[k] != v {
				t.Fatalf("re-published property %q=%q was not on the half message", k, v)
			}
		}
		e1, err1 := wire.Decode(p)
		e2, err2 := wire.Decode(out)
		if (err1 == nil) != (err2 == nil) || !reflect.DeepEqual(e1, e2) {
			t.Fatalf("re-publishing changed the envelope: %+v (%v) -> %+v (%v)", e1, err1, e2, err2)
		}
	})
}
