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
		{"NameServer", func(c *Config) { c.NameServer = []string{"127.0.0.1:9877"} }},
		{"Rate", func(c *Config) { c.Rate = -1 }},
		{"Batch", func(c *Config) { c.Batch = -1 }},
		{"MaxMessages", func(c *Config) { c.MaxMessages = -1 }},
		{"SendTimeout", func(c *Config) { c.SendTimeout = -1 }},
	})
}

// The deprecated NameServer still works alone; a Replayer without name
// servers is refused at Start, naming the field.
func TestDeprecatedNameServerIsMerged(t *testing.T) {
	t.Parallel()
	ns := []string{"127.0.0.1:9876"}
	r, err := New(Config{DB: sqlx.NewDb(nil, "mysql"), NameServer: ns})
	require.NoError(t, err)
	require.Equal(t, ns, r.Config().NameServers)
	r, err = New(Config{DB: sqlx.NewDb(nil, "mysql")})
	require.NoError(t, err)
	err = r.Start(t.Context())
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "NameServers")
}
