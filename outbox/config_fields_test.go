package outbox

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/configtest"
)

// Every invalid Config and RocketMQConfig field gives an ErrConfig naming
// that field, so an operator knows what to fix without reading the source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	require.Same(t, ErrConfig, ErrConfig, "ErrConfig is ErrConfig under the common name")
	ok := Config{DB: sqlx.NewDb(nil, "mysql"), Sink: nopSink{}}
	configtest.FieldErrors(t, "outbox: ", ErrConfig, ok, func(c Config) error { _, err := NewDispatcher(c); return err }, []configtest.Case[Config]{
		{"DB", func(c *Config) { c.DB = nil }},
		{"Sink", func(c *Config) { c.Sink = nil }},
		{"TablePrefix", func(c *Config) { c.TablePrefix = "x;" }},
		{"Name", func(c *Config) { c.Name = "a b" }},
		{"BackoffMax", func(c *Config) { c.BackoffBase, c.BackoffMax = time.Minute, time.Second }},
		{"SendTimeout", func(c *Config) { c.SendTimeout, c.LeaseDuration = time.Minute, time.Second }},
	})
	_, err := NewRocketMQSink(RocketMQConfig{})
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "NameServers")
}

// hangingProducer is a client whose Shutdown never returns.
type hangingProducer struct {
	broker.Producer // unused methods panic
	release         chan struct{}
}

func (h hangingProducer) Shutdown() error { <-h.release; return nil }

// A sink whose client hangs in Shutdown still returns once ctx ends, and a
// second Shutdown (or Close) returns at once.
func TestRocketMQSinkShutdownIsBounded(t *testing.T) {
	t.Parallel()
	h := hangingProducer{release: make(chan struct{})}
	defer close(h.release)
	s := &RocketMQSink{p: h}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Shutdown(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "outbox: ")
	require.Less(t, time.Since(start), 5*time.Second)
	require.NoError(t, s.Close(), "idempotent")
}
