package outbox

import (
	"database/sql"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/rmqtx/rmqtx/internal/sqltime"
	"github.com/rmqtx/rmqtx/wire"
)

// FuzzStoredRow decodes what a row holds (the headers JSON column and the
// timestamps as text) the way Table.Get and the dispatcher do, then builds the
// RocketMQ message of a valid event. Nothing panics; a row with any headers
// column still yields an event; a valid event's message decodes (as a
// consumer does) to the event's envelope with its keys and tag.
func FuzzStoredRow(f *testing.F) {
	f.Add(`{"trace":"t-1","tenant":"a"}`, "2026-01-02 03:04:05.123456", "0190a1b2-0000-7000-8000-000000000001", "OrderPlaced", "orders", "key-1", "Order", "o-1", int64(3), []byte(`{"n":1}`))
	f.Add(`[1,2`, "not a time", "", "", "", "", "", "", int64(-1), []byte{})
	f.Add(`{"a":1}`, "9999-99-99 99:99:99", "id", "T", "t", "", "A", "", int64(0), []byte("x"))
	f.Add(`null`, "", "id\x02", "T\x01", "%RETRY%x", "k k", "", "", int64(0), []byte(nil))
	f.Fuzz(func(t *testing.T, headers, ts, id, typ, dest, key, aggType, aggID string, aggVer int64, payload []byte) {
		var at sqltime.NullTime
		_ = at.Scan(ts) // a time as text, as a DSN without parseTime returns it; bad text is an error, not a panic
		r := rowScan{EventID: id, EventType: typ, Destination: dest, MessageKey: key, AggregateType: aggType, AggregateID: aggID,
			AggregateVersion: aggVer, Payload: payload, Headers: sql.NullString{String: headers, Valid: true},
			Status: string(StatusSending), CreatedAt: at, UpdatedAt: at, LeaseUntil: at}
		row := r.row()
		if row.EventID != id || row.Destination != dest || !reflect.DeepEqual(row.Payload, payload) {
			t.Fatalf("row fields changed: %+v", row.Event)
		}
		e := row.Event
		if err := e.Validate(); err != nil {
			if !errors.Is(err, ErrInvalidEvent) {
				t.Fatalf("validation error does not wrap ErrInvalidEvent: %v", err)
			}
			return
		}
		msg := RocketMQMessage(&Message{Event: e, Attempt: 1})
		got, err := wire.Decode(msg.GetProperties())
		if err != nil {
			t.Fatalf("a valid event's message does not decode: %v", err)
		}
		want := e.Envelope()
		if len(want.Headers) == 0 {
			want.Headers = nil
		}
		if want.AggregateType == "" {
			// The wire carries an aggregate version only with an aggregate
			// (wire.Envelope.Properties); without one it is unversioned.
			want.AggregateVersion = 0
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("decoded %+v, enqueued %+v", got, want)
		}
		if !strings.Contains(msg.GetKeys(), id) || msg.GetTags() != typ {
			t.Fatalf("keys %q / tag %q do not carry id %q / type %q", msg.GetKeys(), msg.GetTags(), id, typ)
		}
	})
}
