package consumer

import (
	"context"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/wire"
)

// TestStaleSkipIsCountedAndLogged: under VersionMonotonic an event older
// than its aggregate's applied version is skipped, and the skip is counted
// by group and type and logged at Info with the event id, the aggregate and
// both versions, never the payload.
func TestStaleSkipIsCountedAndLogged(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *sqlx.DB) {
		ctx := context.Background()
		l, hook := logtest.NewNullLogger()
		l.SetLevel(logrus.InfoLevel)
		m, err := metrics.New(prometheus.NewRegistry())
		require.NoError(t, err)
		p := newProc(t, db, func(c *ProcessorConfig) {
			c.VersionMode = VersionMonotonic
			c.Observe = observe.Observe{Logger: l, Metrics: m}
		})
		const secret = `{"card":"4111-secret"}`
		require.Equal(t, ResultApplied, p.Process(ctx, msg(aggEv(wire.NewEventID(), "b1", 3), `{}`)).Result)
		staleID := wire.NewEventID()
		require.Equal(t, ResultStale, p.Process(ctx, msg(aggEv(staleID, "b1", 2), secret)).Result)

		require.Equal(t, 1.0, testutil.ToFloat64(m.ConsumerStale.WithLabelValues(p.Config().Group, "Moved")))
		var e *logrus.Entry
		for _, x := range hook.AllEntries() {
			if x.Data["event_id"] == staleID {
				e = x
			}
		}
		require.NotNil(t, e, "the skip is logged")
		require.Equal(t, logrus.InfoLevel, e.Level)
		require.Equal(t, "Box", e.Data["aggregate_type"])
		require.Equal(t, "b1", e.Data["aggregate_id"])
		require.EqualValues(t, 2, e.Data["aggregate_version"])
		require.EqualValues(t, 3, e.Data["last_applied_version"])
		s, err := e.String()
		require.NoError(t, err)
		require.NotContains(t, s, "4111-secret", "never the payload")
		require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE status = 'STALE'"))
	})
}

// TestStrictAdoptionOnExistingAggregates: strict mode with no version row
// for an aggregate already at version 4 treats version 5 as a gap (it waits
// for version 1, then parks); SeedAggregateVersion records version 4, after
// which 5 applies and 4 is stale. A seed never moves a version back.
func TestStrictAdoptionOnExistingAggregates(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *sqlx.DB) {
		ctx := context.Background()
		p := newProc(t, db, func(c *ProcessorConfig) { c.VersionMode = VersionStrict; c.MaxWaits = 1 })

		gap := msg(aggEv(wire.NewEventID(), "old", 5), `{}`)
		o := p.Process(ctx, gap)
		require.Equal(t, ResultRetry, o.Result, "no row: strict waits for version 1")
		require.Equal(t, ClassWait, o.Class)
		require.ErrorIs(t, o.Err, ErrVersionGap)

		require.NoError(t, p.SeedAggregateVersion(ctx, "Box", "seeded", 4))
		require.NoError(t, p.SeedAggregateVersion(ctx, "Box", "seeded", 2), "a lower seed is a no-op")
		require.Equal(t, ResultApplied, p.Process(ctx, msg(aggEv(wire.NewEventID(), "seeded", 5), `{}`)).Result)
		require.Equal(t, ResultStale, p.Process(ctx, msg(aggEv(wire.NewEventID(), "seeded", 4), `{}`)).Result)
		require.NoError(t, p.SeedAggregateVersion(ctx, "Box", "seeded", 3), "never moves back")
		require.Equal(t, ResultApplied, p.Process(ctx, msg(aggEv(wire.NewEventID(), "seeded", 6), `{}`)).Result)

		require.ErrorIs(t, p.SeedAggregateVersion(ctx, "", "x", 1), ErrSeedVersion)
		require.ErrorIs(t, p.SeedAggregateVersion(ctx, "Box", "x", 0), ErrSeedVersion)
	})
}
