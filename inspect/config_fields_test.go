package inspect

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// Every invalid Config field gives an ErrConfig naming that field, so an
// operator knows what to fix without reading the source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	ok := Config{DB: sqlx.NewDb(nil, "mysql")}
	_, err := New(ok)
	require.NoError(t, err)
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"DB", func(c *Config) { c.DB = nil }},
		{"TablePrefix", func(c *Config) { c.TablePrefix = "x;" }},
	} {
		c := ok
		tc.mod(&c)
		_, err := New(c)
		require.ErrorIs(t, err, ErrConfig, tc.field)
		require.ErrorContains(t, err, tc.field)
		require.ErrorContains(t, err, "inspect: ")
	}
}

// RemotingLookup takes the deprecated NameServer when NameServers is empty
// and refuses the two set differently, naming both.
func TestRemotingLookupNameServers(t *testing.T) {
	t.Parallel()
	ns := []string{"127.0.0.1:9876"}
	got, err := RemotingLookup{NameServer: ns}.nameServers()
	require.NoError(t, err)
	require.Equal(t, ns, got)
	got, err = RemotingLookup{NameServers: ns, NameServer: []string{"127.0.0.1:9876"}}.nameServers()
	require.NoError(t, err)
	require.Equal(t, ns, got)
	_, err = RemotingLookup{NameServers: ns, NameServer: []string{"127.0.0.1:9877"}}.nameServers()
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "NameServers")
	require.ErrorContains(t, err, "NameServer ")
	_, err = RemotingLookup{NameServers: ns, NameServer: []string{"127.0.0.1:9877"}}.QueryByKey(t.Context(), "T", "k", 1)
	require.ErrorIs(t, err, ErrConfig)
}
