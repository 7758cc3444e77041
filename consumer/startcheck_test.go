package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// TestStartChecksReachability: Start fails, naming the address and the
// cause, against a closed database port and a closed name-server port,
// and starts against the real ones.
func TestStartChecksReachability(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, db *sqlx.DB) {
		s := testenv.Integration(t)
		topic := testenv.Name(t, "topic")
		testenv.CreateTopic(t, topic, 1)
		closed := testenv.ClosedAddr(t)
		routes := map[string]Route{"Created": {Handler: effectHandler}}
		start := func(cfg Config) error {
			c, err := New(cfg)
			require.NoError(t, err)
			began := time.Now()
			err = c.Start(context.Background())
			require.Less(t, time.Since(began), 10*time.Second, "bounded by the check's timeout")
			return err
		}
		cfg := Config{Group: testenv.Name(t, "g"), DB: testenv.PoolVia(t, db, closed), Routes: routes,
			NameServers: []string{s.NameServer}, Topic: topic}
		err := start(cfg)
		require.ErrorIs(t, err, ErrDatabaseUnreachable)
		require.Contains(t, err.Error(), closed+": connection refused")

		cfg.DB, cfg.NameServers = db, []string{closed}
		err = start(cfg)
		require.ErrorIs(t, err, ErrNameServerUnreachable)
		require.Contains(t, err.Error(), closed+": connection refused")

		startConsumer(t, db, topic, testenv.Name(t, "g2"), routes, nil)
	})
}
