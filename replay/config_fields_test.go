package replay

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/configtest"
)

// Every invalid Config field gives an ErrConfig naming that field, so an
// operator knows what to fix without reading the source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	ok := Config{DB: sqlx.NewDb(nil, "mysql"), NameServers: []string{"127.0.0.1:9876"}}
	configtest.FieldErrors(t, "replay: ", ErrConfig, ok, func(c Config) error { _, err := New(c); return err }, []configtest.Case[Config]{
		{"DB", func(c *Config) { c.DB = nil }},
		{"TablePrefix", func(c *Config) { c.TablePrefix = "x;" }},
		{"NameServers", func(c *Config) { c.NameServers = []string{"no-port"} }},
		{"Rate", func(c *Config) { c.Rate = -1 }},
		{"Batch", func(c *Config) { c.Batch = -1 }},
		{"MaxMessages", func(c *Config) { c.MaxMessages = -1 }},
		{"SendTimeout", func(c *Config) { c.SendTimeout = -1 }},
	})
}

// A Replayer without name servers may dry-run, and is refused at Start,
// naming the field.
func TestStartNeedsNameServers(t *testing.T) {
	t.Parallel()
	r, err := New(Config{DB: sqlx.NewDb(nil, "mysql")})
	require.NoError(t, err)
	err = r.Start(t.Context())
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "NameServers")
}
