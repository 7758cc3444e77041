package consumer

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/configtest"
)

// Every invalid Config field gives an ErrConfig naming that field, so an
// operator knows what to fix without reading the source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	h := func(context.Context, *sqlx.Tx, Event) error { return nil }
	ok := Config{
		Group: "g", DB: sqlx.NewDb(nil, "mysql"), Routes: map[string]Route{"T": {Handler: h}},
		NameServers: []string{"127.0.0.1:9876"}, Topic: "t",
	}
	configtest.FieldErrors(t, "consumer: ", ErrConfig, ok, func(c Config) error { _, err := New(c); return err }, []configtest.Case[Config]{
		{"Group", func(c *Config) { c.Group = "" }},
		{"Group", func(c *Config) { c.Group = strings.Repeat("g", 256) }},
		{"DB", func(c *Config) { c.DB = nil }},
		{"Routes", func(c *Config) { c.Routes = nil }},
		{"Routes", func(c *Config) { c.Routes = map[string]Route{"": {Handler: h}} }},
		{`Routes["T"].Handler`, func(c *Config) { c.Routes = map[string]Route{"T": {}} }},
		{`Routes["T"].Version`, func(c *Config) { c.Routes = map[string]Route{"T": {Handler: h, Version: -1}} }},
		{"VersionMode", func(c *Config) { c.VersionMode = 42 }},
		{"UnknownType", func(c *Config) { c.UnknownType = 9 }},
		{"TablePrefix", func(c *Config) { c.TablePrefix = "bad-prefix;" }},
		{"Adopt", func(c *Config) { c.Adopt = &Adoption{ID: IDFromProperty} }},
		{"NameServers", func(c *Config) { c.NameServers = nil }},
		{"Topic", func(c *Config) { c.Topic = "a b" }},
		{"Topic", func(c *Config) { c.Topic = "" }},
		{"BatchSize", func(c *Config) { c.BatchSize = 2000 }},
		{"ProcessorConfig", func(c *Config) { c.ProcessorConfig = ProcessorConfig{Group: "g"} }},
	})
}
