package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
)

// The hand-written outbox (the floor the dispatcher is judged against)
// sends every row once through the real broker and leaves every row SENT,
// with more rows than one claim and more claimers than claims' worth of
// rows at the end (its CHECK would fail the round otherwise); the probe's
// figures are on the round.
func TestOutboxHandDrainsEveryRow(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, testOutboxHandDrainsEveryRow)
}

func testOutboxHandDrainsEveryRow(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := javaTestEnv(t, db)
	topic := e.Names.Name("otopic")
	require.NoError(t, e.CreateTopic(ctx, topic, 4))
	p, err := e.newRawProducer(e.Names.Name("ohand"), 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Shutdown() })
	const rows = 3*handClaim + 7
	evs := make([]outbox.Event, rows)
	for i := range evs {
		evs[i] = outbox.Event{EventID: fmt.Sprintf("%s-h%04d", e.Names.Run(), i), EventType: benchEventType, Destination: topic, Payload: makePayload(64, int64(i))}
	}
	r, err := outboxHand(ctx, e, p, 1, evs, 4, newServerProbe(e, db))
	require.NoError(t, err)
	require.EqualValues(t, rows, r.Count)
	require.Positive(t, r.Rate)
	require.Contains(t, r.Extra, probeCPUDB, "the probe found the database (a short round may cost it less than a clock tick)")
}
