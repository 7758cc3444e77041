package txlog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/sqlcount"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
)

// With go-sql-driver's default DSN (no interpolateParams) every statement of
// the store costs one round trip once prepared: the insert on the caller's
// transaction, Get (one statement, not a transaction) and the fence (insert
// plus read-back). Counted by the server on the only connection of the pool.
func TestOneRoundTripPerStatement(t *testing.T) {
	t.Parallel()
	base := setup(t)
	for _, interpolate := range []bool{false, true} {
		t.Run(fmt.Sprintf("interpolateParams=%v", interpolate), func(t *testing.T) {
			cfg, err := mysql.ParseDSN(testenv.Load().DSN(testenv.DBName(t, base.DB())))
			require.NoError(t, err)
			cfg.InterpolateParams = interpolate
			one, err := sqlcount.Single(cfg.FormatDSN())
			require.NoError(t, err)
			t.Cleanup(func() { _ = one.Close() })
			s, err := txlog.New(one, txlog.DefaultPrefix)
			require.NoError(t, err)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			m, err := sqlcount.NewMeter(ctx, one)
			require.NoError(t, err)

			prefix := fmt.Sprintf("rt%v-", interpolate)
			localTx := func(id string) error {
				tx, err := one.BeginTxx(ctx, nil)
				if err != nil {
					return err
				}
				if err := s.Insert(ctx, tx, committed(id)); err != nil {
					_ = tx.Rollback()
					return err
				}
				return tx.Commit()
			}
			// Warm-up: every statement once (the in-transaction insert is
			// prepared in the background after its first, unprepared, use).
			require.NoError(t, localTx(prefix+"warm"))
			_, err = s.Get(ctx, prefix+"warm")
			require.NoError(t, err)
			_, _, err = s.Fence(ctx, txlog.Row{EventID: prefix + "warm-fence"})
			require.NoError(t, err)
			testenv.Eventually(t, 10*time.Second, "warm-up", func() bool {
				c, err := m.Measure(ctx, func() error { return localTx(prefix + "probe-" + testenv.RandSuffix(8)) })
				return err == nil && c.Prepare == 0
			})

			const n = 10
			c, err := m.Measure(ctx, func() error {
				for i := 0; i < n; i++ {
					if err := localTx(fmt.Sprintf("%sins-%d", prefix, i)); err != nil {
						return err
					}
				}
				return nil
			})
			require.NoError(t, err)
			t.Logf("local tx (BEGIN; insert; COMMIT) x%d: %s", n, c)
			require.EqualValues(t, 3*n, c.RoundTrips(), "BEGIN, the insert, COMMIT")
			require.Zero(t, c.Prepare)

			c, err = m.Measure(ctx, func() error {
				for i := 0; i < n; i++ {
					r, err := s.Get(ctx, fmt.Sprintf("%sins-%d", prefix, i))
					if err != nil {
						return err
					}
					if r.State != txlog.StateCommitted {
						return fmt.Errorf("state %s", r.State)
					}
					if _, err := s.Get(ctx, prefix+"missing"); err == nil {
						return fmt.Errorf("missing row found")
					}
				}
				return nil
			})
			require.NoError(t, err)
			t.Logf("Get x%d (found) + x%d (missing): %s", n, n, c)
			require.EqualValues(t, 2*n, c.RoundTrips(), "one statement per Get")

			c, err = m.Measure(ctx, func() error {
				for i := 0; i < n; i++ {
					row, fenced, err := s.Fence(ctx, txlog.Row{EventID: fmt.Sprintf("%sfence-%d", prefix, i)})
					if err != nil {
						return err
					}
					if !fenced || row.State != txlog.StateRolledBack {
						return fmt.Errorf("fence: %v %s", fenced, row.State)
					}
				}
				return nil
			})
			require.NoError(t, err)
			t.Logf("Fence x%d: %s", n, c)
			require.EqualValues(t, 2*n, c.RoundTrips(), "INSERT IGNORE and the read-back")
		})
	}
}
