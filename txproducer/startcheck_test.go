package txproducer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// TestStartChecksReachability: Start fails, naming the address and the
// cause, against a closed database port and a closed name-server port, and
// succeeds against the real ones; a Start error is never advice to retry a
// Send.
func TestStartChecksReachability(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		ctx := context.Background()
		closed := testenv.ClosedAddr(t)
		start := func(cfg txproducer.Config) error {
			cfg.WarmupTopics = nil
			p, err := txproducer.New(cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = p.Close() })
			began := time.Now()
			err = p.Start(ctx)
			require.Less(t, time.Since(began), 10*time.Second, "bounded by the check's timeout")
			return err
		}

		cfg := b.config()
		cfg.DB = testenv.PoolVia(t, b.db, closed)
		err := start(cfg)
		require.ErrorIs(t, err, txproducer.ErrDatabaseUnreachable)
		require.ErrorIs(t, err, txproducer.ErrStart)
		require.Contains(t, err.Error(), closed+": connection refused")
		require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(err))

		cfg = b.config()
		cfg.NameServers = []string{closed}
		err = start(cfg)
		require.ErrorIs(t, err, txproducer.ErrNameServerUnreachable)
		require.ErrorIs(t, err, txproducer.ErrStart)
		require.Contains(t, err.Error(), closed+": connection refused")
		require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(err))

		cfg = b.config()
		cfg.NameServers = []string{b.s.Broker} // a RocketMQ port, but not a name server
		err = start(cfg)
		require.ErrorIs(t, err, txproducer.ErrNameServerUnreachable)
		require.Contains(t, err.Error(), b.s.Broker+": not a name server")

		require.NoError(t, start(b.config()))
	})
}

// TestSendNotSentState: a Send that stops before anything is sent reports
// StateNotSent ("not_sent"), not rolled_back.
func TestSendNotSentState(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		fn := func(context.Context, *sqlx.Tx) error { return nil }
		idle, err := txproducer.New(b.config())
		require.NoError(t, err)
		res, err := idle.Send(context.Background(), b.msg(""), fn)
		require.ErrorIs(t, err, txproducer.ErrNotStarted)
		require.Equal(t, txproducer.StateNotSent, res.State)
		require.Equal(t, "not_sent", res.State.String())

		p := startProducer(t, b.config())
		res, err = p.Send(context.Background(), b.msg(""), nil)
		require.ErrorIs(t, err, txproducer.ErrInvalidMessage)
		require.Equal(t, txproducer.StateNotSent, res.State)

		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		id := "cancelled-" + testenv.RandSuffix(6)
		res, err = p.Send(ctx, b.msg(id), fn)
		require.ErrorIs(t, err, context.Canceled)
		require.Equal(t, txproducer.StateNotSent, res.State)
		require.Equal(t, 0, countOrders(t, b, id))
	})
}

// TestLocalTxDeadlineNamed: a local-transaction function that outlives
// LocalTxTimeout gets an error that says so (and wraps
// context.DeadlineExceeded), whether it ignores ctx (its COMMIT fails) or
// returns ctx's error.
func TestLocalTxDeadlineNamed(t *testing.T) {
	t.Parallel()
	eachDB(t, 1, func(t *testing.T, b *bundle) {
		cfg := b.config()
		cfg.LocalTxTimeout = 300 * time.Millisecond
		p := startProducer(t, cfg)
		for name, fn := range map[string]txproducer.LocalTxFunc{
			"ignores ctx": func(ctx context.Context, tx *sqlx.Tx) error { <-ctx.Done(); return nil },
			"returns ctx's error": func(ctx context.Context, tx *sqlx.Tx) error {
				<-ctx.Done()
				return ctx.Err()
			},
		} {
			res, err := p.Send(context.Background(), b.msg(""), fn)
			require.Error(t, err, name)
			require.ErrorIs(t, err, context.DeadlineExceeded, name)
			require.Contains(t, err.Error(), "LocalTxTimeout", name)
			require.NotEqual(t, txproducer.StateCommitted, res.State, name)
			t.Logf("%s: %v", name, err)
		}
	})
}

// TestRetryAdviceOfStartAndBrokerRefusals: a Start error is DontRetry, and
// so is a Send refused by the broker for a reason another Send cannot
// change (topic missing, no permission, message illegal).
func TestRetryAdviceOfStartAndBrokerRefusals(t *testing.T) {
	t.Parallel()
	send := func(code int) error {
		return fmt.Errorf("%w: t: %w", txproducer.ErrSend, primitive.MQBrokerErr{ResponseCode: int16(code), ErrorMessage: "x"})
	}
	require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(fmt.Errorf("%w: %w", txproducer.ErrStart, errors.New("x"))))
	require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(fmt.Errorf("%w: x", txproducer.ErrNameServerUnreachable)))
	require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(fmt.Errorf("%w: x", txproducer.ErrDatabaseUnreachable)))
	for _, code := range []int{13, 16, 17} {
		require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(send(code)), "code %d", code)
	}
	for _, code := range []int{1, 2, 14} {
		require.NotEqual(t, txproducer.DontRetry, txproducer.RetryAdvice(send(code)), "code %d", code)
	}
	require.ErrorIs(t, txproducer.ErrPayloadTooLarge, wire.ErrPayloadTooLarge)
}

func countOrders(t *testing.T, b *bundle, id string) int {
	t.Helper()
	var n int
	require.NoError(t, b.db.Get(&n, b.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	return n
}
