package checkback_test

import (
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/wire"
)

// FuzzCheckRequest feeds what a check request or a discarded half message
// carries (properties blob, topic, born timestamp) to QueryFromMessage.
// Nothing panics; the query reads the event id, the half's UNIQ_KEY and the
// real topic from the properties. (Package discard fuzzes the properties of
// a re-published message.)
func FuzzCheckRequest(f *testing.F) {
	env := wire.Envelope{EventID: "0190a1b2-0000-7000-8000-000000000001", EventType: "OrderPlaced", BusinessKey: "k"}
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
		if q.EventID != p[wire.PropEventID] {
			t.Fatalf("event id %q read as %q", p[wire.PropEventID], q.EventID)
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
		if q.HalfKey != p[primitive.PropertyUniqueClientMessageIdKeyIndex] {
			t.Fatalf("UNIQ_KEY %q read as %q", p[primitive.PropertyUniqueClientMessageIdKeyIndex], q.HalfKey)
		}
	})
}
