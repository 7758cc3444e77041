package checkback

import (
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/txlog"
)

// Every invalid Config and RecoveryConfig field gives an ErrConfig naming
// that field, so an operator knows what to fix without reading the source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	log, err := txlog.New(sqlx.NewDb(nil, "mysql"), "")
	require.NoError(t, err)
	ok := Config{Log: log, Group: "g"}
	_, err = New(ok)
	require.NoError(t, err)
	for _, tc := range []struct {
		field string
		mod   func(*Config)
	}{
		{"Log", func(c *Config) { c.Log = nil }},
		{"Group", func(c *Config) { c.Group = "" }},
	} {
		c := ok
		tc.mod(&c)
		_, err := New(c)
		require.ErrorIs(t, err, ErrConfig, tc.field)
		require.ErrorContains(t, err, tc.field)
		require.ErrorContains(t, err, "checkback: ")
	}

	rok := RecoveryConfig{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Log: log}
	_, err = NewRecovery(rok)
	require.NoError(t, err)
	for _, tc := range []struct {
		field string
		mod   func(*RecoveryConfig)
	}{
		{"NameServers", func(c *RecoveryConfig) { c.NameServers = nil }},
		{"NameServer", func(c *RecoveryConfig) { c.NameServer = []string{"127.0.0.1:9877"} }},
		{"Group", func(c *RecoveryConfig) { c.Group = "" }},
		{"Log", func(c *RecoveryConfig) { c.Log = nil }},
		{"RetryBackoff", func(c *RecoveryConfig) { c.RetryBackoff = -time.Second }},
		{"RetryMaxBackoff", func(c *RecoveryConfig) { c.RetryBackoff, c.RetryMaxBackoff = time.Second, time.Millisecond }},
	} {
		c := rok
		tc.mod(&c)
		_, err := NewRecovery(c)
		require.ErrorIs(t, err, ErrConfig, tc.field)
		require.ErrorContains(t, err, tc.field)
		require.ErrorContains(t, err, "checkback: ")
	}
}

// The deprecated NameServer still works alone.
func TestDeprecatedNameServerIsMerged(t *testing.T) {
	t.Parallel()
	log, err := txlog.New(sqlx.NewDb(nil, "mysql"), "")
	require.NoError(t, err)
	ns := []string{"127.0.0.1:9876"}
	r, err := NewRecovery(RecoveryConfig{NameServer: ns, Group: "g", Log: log})
	require.NoError(t, err)
	require.Equal(t, ns, r.cfg.NameServers)
}
