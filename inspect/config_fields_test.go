package inspect

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
	ok := Config{DB: sqlx.NewDb(nil, "mysql")}
	configtest.FieldErrors(t, "inspect: ", ErrConfig, ok, func(c Config) error { _, err := New(c); return err }, []configtest.Case[Config]{
		{"DB", func(c *Config) { c.DB = nil }},
		{"TablePrefix", func(c *Config) { c.TablePrefix = "x;" }},
	})
}

// RemotingLookup refuses missing or malformed name servers, naming the
// field, before it sends anything.
func TestRemotingLookupNameServers(t *testing.T) {
	t.Parallel()
	ns := []string{"127.0.0.1:9876"}
	got, err := RemotingLookup{NameServers: ns}.nameServers()
	require.NoError(t, err)
	require.Equal(t, ns, got)
	for _, bad := range [][]string{nil, {"127.0.0.1"}} {
		_, err = RemotingLookup{NameServers: bad}.QueryByKey(t.Context(), "T", "k", 1)
		require.ErrorIs(t, err, ErrConfig)
		require.ErrorContains(t, err, "NameServers")
	}
}
