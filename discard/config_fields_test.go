package discard_test

import (
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/configtest"
)

// Every invalid Config field gives an ErrConfig naming that field, with the
// package's prefix, so an operator knows what to fix without reading the
// source.
func TestConfigErrorsNameTheField(t *testing.T) {
	t.Parallel()
	ok := discard.Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Log: newFakeLog()}
	configtest.FieldErrors(t, "discard: ", discard.ErrConfig, ok, func(c discard.Config) error { _, err := discard.New(c); return err }, []configtest.Case[discard.Config]{
		{Field: "NameServers", Break: func(c *discard.Config) { c.NameServers = nil }},
		{Field: "Group", Break: func(c *discard.Config) { c.Group = "" }},
		{Field: "Log", Break: func(c *discard.Config) { c.Log = nil }},
		{Field: "RetryBackoff", Break: func(c *discard.Config) { c.RetryBackoff = -time.Second }},
		{Field: "RetryMaxBackoff", Break: func(c *discard.Config) { c.RetryBackoff, c.RetryMaxBackoff = time.Second, time.Millisecond }},
	})
}

// The documented defaults.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c := discard.Config{Group: "orders-tx"}.WithDefaults()
	if c.ConsumerGroup != "orders-tx-recovery" || c.PublisherGroup != "orders-tx-republish" {
		t.Fatalf("groups: %q, %q", c.ConsumerGroup, c.PublisherGroup)
	}
	if len(c.InstanceName) <= len(c.ConsumerGroup)+1 || c.InstanceName[:len(c.ConsumerGroup)+1] != "orders-tx-recovery-" {
		t.Fatalf("instance name %q", c.InstanceName)
	}
	if other := (discard.Config{Group: "orders-tx"}).WithDefaults(); other.InstanceName == c.InstanceName {
		t.Fatal("the instance name must be new for every Recovery")
	}
	for name, got := range map[string][2]time.Duration{
		"StartRetry":      {c.StartRetry, discard.DefaultStartRetry},
		"SendTimeout":     {c.SendTimeout, discard.DefaultSendTimeout},
		"QueryTimeout":    {c.QueryTimeout, discard.DefaultQueryTimeout},
		"RetryBackoff":    {c.RetryBackoff, discard.DefaultRetryBackoff},
		"RetryMaxBackoff": {c.RetryMaxBackoff, discard.DefaultRetryMaxBackoff},
	} {
		if got[0] != got[1] {
			t.Errorf("%s = %s, want %s", name, got[0], got[1])
		}
	}
	if c.Logger == nil {
		t.Error("a nil Logger must become a quiet one")
	}
	if big := (discard.Config{RetryBackoff: time.Minute}).WithDefaults(); big.RetryMaxBackoff != time.Minute {
		t.Errorf("RetryMaxBackoff follows a larger RetryBackoff: %s", big.RetryMaxBackoff)
	}
}
