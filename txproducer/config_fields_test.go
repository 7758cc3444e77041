package txproducer

import (
	"database/sql"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/configtest"
	"github.com/rmqtx/rmqtx/txlog"
)

// Every invalid Config field gives an ErrConfig naming that field, so an
// operator knows what to fix without reading the source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	db := sqlx.NewDb(nil, "mysql")
	other, err := txlog.New(sqlx.NewDb(&sql.DB{}, "mysql"), "")
	require.NoError(t, err)
	ok := Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", DB: db}
	configtest.FieldErrors(t, "txproducer: ", ErrConfig, ok, func(c Config) error { _, err := New(c); return err }, []configtest.Case[Config]{
		{"NameServers", func(c *Config) { c.NameServers = nil }},
		{"NameServers", func(c *Config) { c.NameServers = []string{"nope"} }},
		{"Group", func(c *Config) { c.Group = "" }},
		{"Group", func(c *Config) { c.Group = "a b" }},
		{"DB", func(c *Config) { c.DB = nil }},
		{"Log", func(c *Config) { c.Log = other }},
		{"TablePrefix", func(c *Config) { c.TablePrefix = "x;" }},
		{"MaxPayloadBytes", func(c *Config) { c.MaxPayloadBytes = 5 << 20 }},
		{"WarmupTopics", func(c *Config) { c.WarmupTopics = []string{"a b"} }},
	})
}
