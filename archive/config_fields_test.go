package archive

import (
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/configtest"
)

// Every invalid Config field gives an ErrConfig naming that field, so an
// operator knows what to fix without reading the source. A retention below
// its minimum is also ErrRetentionTooShort.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	ok := Config{DB: sqlx.NewDb(nil, "mysql")}
	configtest.FieldErrors(t, "archive: ", ErrConfig, ok, func(c Config) error { _, err := New(c); return err }, []configtest.Case[Config]{
		{"DB", func(c *Config) { c.DB = nil }},
		{"TablePrefix", func(c *Config) { c.TablePrefix = "x;" }},
		{"Tables", func(c *Config) { c.Tables = []Table{"nope"} }},
		{"Batch", func(c *Config) { c.Batch = -1 }},
		{"MaxBatches", func(c *Config) { c.MaxBatches = -1 }},
		{"RowsPerSecond", func(c *Config) { c.RowsPerSecond = -1 }},
		{"TxlogRetention", func(c *Config) { c.TxlogRetention = time.Minute }},
		{"DeadLetterRetention", func(c *Config) { c.DeadLetterRetention = 10000 * 24 * time.Hour }},
	})
	c := ok
	c.TxlogRetention = time.Minute
	_, err := New(c)
	require.ErrorIs(t, err, ErrRetentionTooShort)
}
