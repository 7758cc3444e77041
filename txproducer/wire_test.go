package txproducer_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// TestWireDefaults: what a Java consumer sees of a Send, on the real broker.
// The event type is the tag unless the caller sets one, the event id is the
// last key, and the format and event versions are always present (also 0).
func TestWireDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t, 1)
	p := startProducer(t, b.config())
	ctx := context.Background()
	noop := func(context.Context, *sqlx.Tx) error { return nil }
	sends := []txproducer.Message{
		{Topic: b.topic, EventType: "OrderPlaced", Payload: []byte(`{"n":1}`)},
		{Topic: b.topic, EventType: "OrderPlaced", Tags: "custom", Payload: []byte(`{"n":2}`)},
		{Topic: b.topic, EventType: "OrderPaid", EventVersion: 3, Keys: []string{"order-1", "cust-9"}, Payload: []byte(`{"n":3}`)},
		// A type that a tag expression cannot match still travels as its tag
		// (only the caller's Tags are held to the tag rules).
		{Topic: b.topic, EventType: "A||B", Payload: []byte(`{"n":4}`)},
	}
	ids := make([]string, len(sends))
	for i, m := range sends {
		res, err := p.Send(ctx, m, noop)
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		ids[i] = res.EventID
	}
	b.coll.WaitDistinct(t, len(sends), 30*time.Second)
	wantTags := []string{"OrderPlaced", "custom", "OrderPaid", "A||B"}
	wantVersion := []string{"0", "0", "3", "0"}
	for i, id := range ids {
		m := b.coll.Message(id)
		require.NotNil(t, m, "event %d", i)
		require.Equal(t, wantTags[i], m.GetTags(), "event %d: tag", i)
		require.Equal(t, id, wire.EventIDFromKeys(m.GetKeys()), "event %d: the id is the last key", i)
		require.Equal(t, wantVersion[i], m.GetProperty(wire.PropEventVersion), "event %d: event version always sent", i)
		require.Equal(t, "1", m.GetProperty(wire.PropFormatVersion), "event %d: format version", i)
	}
	require.Equal(t, "order-1 cust-9 "+ids[2], b.coll.Message(ids[2]).GetKeys(), "caller keys first, in order")
	// The txlog row (which discard recovery re-publishes from) records the
	// same tag.
	row, err := b.store.Get(ctx, ids[0])
	require.NoError(t, err)
	require.Equal(t, "OrderPlaced", row.Tags)
}
