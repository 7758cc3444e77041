package main

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
)

// TestQuickstart runs the README's program (run, what main calls) against
// the real broker, once per database, on a fresh database and its own topic
// and groups. run returns once the order counted two applied events; the
// test then reads every table the two paths wrote: one committed txlog row,
// one SENT outbox row, and exactly two consume-log rows of the group, one
// per event. Shutdown has finished by then, so a redelivery that applied an
// event twice would show as a count above 2.
func TestQuickstart(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		s := testenv.Integration(t)
		topic := testenv.Name(t, "qs")
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		require.NoError(t, run(ctx, db, s.NameServer, topic))

		var orders []struct {
			ID     string `db:"id"`
			Events int    `db:"events"`
		}
		require.NoError(t, db.Select(&orders, "SELECT id, events FROM qs_orders"))
		require.Len(t, orders, 1)
		require.Equal(t, 2, orders[0].Events, "each event applied once")

		tables, err := consumer.Tables("")
		require.NoError(t, err)
		var types []string
		require.NoError(t, db.Select(&types, db.Rebind("SELECT event_type FROM "+tables.ConsumeLog+
			" WHERE consumer_group = ? AND status = ? ORDER BY event_type"), topic+"-counter", consumer.StatusApplied))
		require.Equal(t, []string{"OrderPlaced", "ReceiptRequested"}, types)

		var txStates []string
		require.NoError(t, db.Select(&txStates, "SELECT state FROM "+txlog.DefaultPrefix+txlog.TableSuffix))
		require.Equal(t, []string{string(txlog.StateCommitted)}, txStates)

		var outboxStates []string
		require.NoError(t, db.Select(&outboxStates, "SELECT status FROM "+outbox.DefaultPrefix+outbox.TableSuffix))
		require.Equal(t, []string{string(outbox.StatusSent)}, outboxStates)
	})
}
