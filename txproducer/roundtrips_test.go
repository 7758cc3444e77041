package txproducer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/sqlcount"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txproducer"
)

// A Send costs the same statements whether rmqtx assigns the event id or
// the caller derives it from a business key: BEGIN, the txlog insert, the
// caller's insert and COMMIT, counted by the server on the producer's only
// connection. A caller-supplied id is not looked up first; the txlog
// insert, the first statement of the local transaction, decides duplicates.
func TestSendStatementsPerIDKind(t *testing.T) {
	t.Parallel()
	// MariaDB only: package sqlcount counts with the server's session
	// counters through go-sql-driver. PostgreSQL runs the same statements.
	b := setupOn(t, testenv.MySQLDB(t), 1)
	one, err := sqlcount.Single(b.s.DSN(testenv.DBName(t, b.db)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = one.Close() })
	cfg := b.config()
	cfg.DB = one
	p := startProducer(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := sqlcount.NewMeter(ctx, one)
	require.NoError(t, err)

	// The caller's statement is plain text (no arguments): one round trip
	// whatever the DSN, so the count is rmqtx's alone plus one.
	order := func(id string) txproducer.LocalTxFunc {
		return func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, amount) VALUES ('"+id+"', 1)")
			return err
		}
	}
	send := func(id string) (txproducer.Result, error) {
		msg := b.msg(id)
		if id == "" {
			msg.EventID = ""
			id = "auto-" + testenv.RandSuffix(10)
		}
		return p.Send(ctx, msg, order(id))
	}
	// Warm-up: every statement prepared once.
	testenv.Eventually(t, 20*time.Second, "statements prepared", func() bool {
		c, err := m.Measure(ctx, func() error { _, err := send(""); return err })
		return err == nil && c.Prepare == 0
	})

	const n = 10
	perSend := map[string]float64{}
	for _, kind := range []string{"assigned", "business key"} {
		c, err := m.Measure(ctx, func() error {
			for i := 0; i < n; i++ {
				id := ""
				if kind == "business key" {
					id = fmt.Sprintf("order-%s-%d", testenv.RandSuffix(6), i)
				}
				res, err := send(id)
				if err != nil {
					return err
				}
				if res.State != txproducer.StateCommitted || res.Duplicate {
					return fmt.Errorf("send %d: %+v", i, res)
				}
			}
			return nil
		})
		require.NoError(t, err)
		perSend[kind] = float64(c.RoundTrips()) / n
		t.Logf("Send, %s id, x%d: %s (%.1f round trips per Send)", kind, n, c, perSend[kind])
		require.Zero(t, c.Prepare, kind)
		require.EqualValues(t, 4*n, c.RoundTrips(), "%s id: BEGIN, txlog insert, the caller's insert, COMMIT", kind)
	}
	require.Equal(t, perSend["assigned"], perSend["business key"])
}
