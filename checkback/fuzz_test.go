package checkback_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/envelope"
)

// FuzzCheckRequest feeds what a check request or a discarded half message
// carries (properties blob, topic, born timestamp) to QueryFromMessage and
// RepublishProperties. Nothing panics; the query reads the event id and the
// real topic from the properties; the properties of a re-published message
// keep the event's identity (they decode to the same envelope, or fail the
// same way) and drop every transaction property.
func FuzzCheckRequest(f *testing.F) {
	env := envelope.Envelope{EventID: "0190a1b2-0000-7000-8000-000000000001", EventType: "OrderPlaced", BusinessKey: "k"}
	m := primitive.NewMessage("RMQ_SYS_TRANS_HALF_TOPIC", nil)
	m.WithProperties(env.Properties([]byte("{}")))
	m.WithProperty(primitive.PropertyRealTopic, "orders")
	m.WithProperty(primitive.PropertyTransactionPrepared, "true")
	m.WithProperty(primitive.PropertyProducerGroup, "pg")
	f.Add(m.MarshallProperties(), "RMQ_SYS_TRANS_HALF_TOPIC", int64(1700000000000))
	f.Add("RMQTX_PROBE\x011\x02PGROUP\x01pg\x02", "orders", int64(0))
	f.Add("REAL_TOPIC\x01\x02RMQTX_EVENT_ID\x01\x00\x02", "", int64(-5))
	f.Fuzz(func(t *testing.T, props, topic string, born int64) {
		ext := &primitive.MessageExt{Message: primitive.Message{Topic: topic}, BornTimestamp: born}
		ext.UnmarshalProperties([]byte(props))
		p := ext.GetProperties()
		q := checkback.QueryFromMessage(ext)
		if q.EventID != p[envelope.PropEventID] {
			t.Fatalf("event id %q read as %q", p[envelope.PropEventID], q.EventID)
		}
		want := topic
		if rt := p[primitive.PropertyRealTopic]; rt != "" {
			want = rt
		}
		if q.Topic != want {
			t.Fatalf("topic %q, want %q", q.Topic, want)
		}
		if (born > 0) == q.BornAt.IsZero() || (born > 0 && !q.BornAt.Equal(time.UnixMilli(born))) {
			t.Fatalf("born %d read as %v", born, q.BornAt)
		}
		out := checkback.RepublishProperties(p)
		for _, k := range []string{primitive.PropertyTransactionPrepared, primitive.PropertyProducerGroup, primitive.PropertyRealTopic, primitive.PropertyRealQueueId} {
			if _, ok := out[k]; ok {
				t.Fatalf("re-published message keeps %s", k)
			}
		}
		for k, v := range out {
			if p[k] != v {
				t.Fatalf("re-published property %q=%q was not on the half message", k, v)
			}
		}
		e1, err1 := envelope.Decode(p)
		e2, err2 := envelope.Decode(out)
		if (err1 == nil) != (err2 == nil) || !reflect.DeepEqual(e1, e2) {
			t.Fatalf("re-publishing changed the envelope: %+v (%v) -> %+v (%v)", e1, err1, e2, err2)
		}
	})
}
