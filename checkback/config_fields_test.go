package checkback

import (
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/configtest"
	"github.com/rmqtx/rmqtx/txlog"
)

// Every invalid Config field gives an ErrConfig naming
// that field, so an operator knows what to fix without reading the source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	log, err := txlog.New(sqlx.NewDb(nil, "mysql"), "")
	require.NoError(t, err)
	ok := Config{Log: log, Group: "g"}
	configtest.FieldErrors(t, "checkback: ", ErrConfig, ok, func(c Config) error { _, err := New(c); return err }, []configtest.Case[Config]{
		{Field: "Log", Break: func(c *Config) { c.Log = nil }},
		{Field: "Group", Break: func(c *Config) { c.Group = "" }},
	})
}
