package txproducer_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txproducer"
)

// Start reads the database's clock and compares it with the host's
// (Config.Test.Now stands in for a host whose clock is skewed: libfaketime
// does not reach a Go binary, whose runtime reads the clock through the
// vDSO). Past MaxClockSkew(FenceAge) = FenceAge/2 it refuses with
// ErrClockSkew naming both readings and the bound; above FenceAge/10 it
// warns and starts; an honest host clock starts quietly, which also shows
// that both databases' "now" is read as the right UTC instant (a time-zone
// slip would measure hours).
func TestStartClockSkew(t *testing.T) {
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		skewed := func(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }
		start := func(t *testing.T, d time.Duration) (*txproducer.Producer, *test.Hook, error) {
			l, hook := test.NewNullLogger()
			l.SetLevel(logrus.DebugLevel)
			cfg := b.config()
			cfg.Logger = l
			if d != 0 {
				cfg.Test.Now = skewed(d)
			}
			p, err := txproducer.New(cfg)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = p.Start(ctx)
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				require.NoError(t, p.Shutdown(ctx))
			})
			return p, hook, err
		}
		skewWarnings := func(hook *test.Hook) []*logrus.Entry {
			var out []*logrus.Entry
			for _, e := range hook.AllEntries() {
				if e.Level == logrus.WarnLevel && e.Data["skew"] != nil {
					out = append(out, e)
				}
			}
			return out
		}
		bound := txproducer.MaxClockSkew(testFenceAge)
		require.Equal(t, testFenceAge/2, bound)

		for _, d := range []time.Duration{30 * time.Second, -30 * time.Second} {
			t.Run("refused "+d.String(), func(t *testing.T) {
				_, _, err := start(t, d)
				require.Error(t, err)
				require.True(t, errors.Is(err, txproducer.ErrClockSkew), "%v", err)
				require.True(t, errors.Is(err, txproducer.ErrStart), "%v", err)
				require.Contains(t, err.Error(), "this host's clock reads")
				require.Contains(t, err.Error(), "the database's")
				require.Contains(t, err.Error(), "FenceAge/2 = "+bound.String())
				t.Logf("%v", err)
			})
		}
		for _, d := range []time.Duration{time.Second, -time.Second} {
			t.Run("warned "+d.String(), func(t *testing.T) {
				p, hook, err := start(t, d)
				require.NoError(t, err, "a skew below FenceAge/2 must not stop Start")
				ws := skewWarnings(hook)
				require.Len(t, ws, 1, "one skew warning")
				require.Equal(t, bound.String(), ws[0].Data["bound"])
				t.Logf("warning: %s %v", ws[0].Message, ws[0].Data)
				// The producer works: a Send commits and arrives once.
				id := "skew-" + d.String()
				res, err := p.Send(context.Background(), b.msg(id), insertOrder(id))
				require.NoError(t, err)
				require.Equal(t, txproducer.StateCommitted, res.State)
				// The client ends an unkeyed commit one-way, and the broker
				// may process the next Send's END_TRANSACTION first, so the
				// event is awaited before the marker that counts its copies
				// (a fresh clone's run once saw the marker overtake it).
				require.True(t, b.coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[id] > 0 }), "the event arrived")
				b.sendMarker(t, p)
				require.Equal(t, 1, b.coll.Snapshot().Counts[id], "the event arrived once")
			})
		}
		t.Run("honest clock", func(t *testing.T) {
			_, hook, err := start(t, 0)
			require.NoError(t, err)
			require.Empty(t, skewWarnings(hook), "the host and the database on one machine agree")
			var measured *logrus.Entry
			for _, e := range hook.AllEntries() {
				if e.Level == logrus.DebugLevel && e.Data["skew"] != nil {
					measured = e
				}
			}
			require.NotNil(t, measured, "the skew is measured and logged at debug")
			t.Logf("measured: %v", measured.Data)
		})
	})
}
