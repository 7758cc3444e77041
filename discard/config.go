package discard

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/txlog"
)

// Defaults.
const (
	DefaultStartRetry      = 5 * time.Second
	DefaultSendTimeout     = 3 * time.Second
	DefaultQueryTimeout    = 3 * time.Second
	DefaultRetryBackoff    = 500 * time.Millisecond
	DefaultRetryMaxBackoff = 5 * time.Second
)

// Log is the part of *txlog.Store that recovery uses.
type Log interface {
	checkback.Log
	MarkRecovered(ctx context.Context, id string, d txlog.RecoveryDecision, note string) error
}

// Publisher sends a normal message (the republish path). The default is a
// rocketmq-client-go producer in its own group.
type Publisher interface {
	SendSync(ctx context.Context, msgs ...*broker.Message) (*broker.SendResult, error)
}

// Config configures a Recovery.
type Config struct {
	// NameServers lists name server addresses (host:port). Required.
	NameServers []string
	// Group is the producer group whose discarded half messages are
	// recovered (the PGROUP property). Required.
	Group string
	// Log is the transaction log (a *txlog.Store). Required. Recovery
	// decides from it only.
	Log Log
	// ConsumerGroup consumes Topic. Default Group+"-recovery". All
	// instances of the producer group share it, so each broker's discard
	// topic (one queue) is recovered by one instance at a time.
	ConsumerGroup string
	// PublisherGroup is the normal producer group used to republish.
	// Default Group+"-republish" (distinct from the transactional group).
	PublisherGroup string
	// InstanceName is the client instance name. Default
	// ConsumerGroup+"-"+a random suffix, new for every Recovery.
	InstanceName string
	// StartRetry is how often to look for Topic's route while the topic
	// does not exist yet (the broker creates it on the first discard);
	// each look is one name server request. Default DefaultStartRetry
	// (5 s).
	StartRetry time.Duration
	// SendTimeout bounds one republish. Default DefaultSendTimeout (3 s).
	SendTimeout time.Duration
	// QueryTimeout bounds the txlog queries for one message. Default
	// DefaultQueryTimeout (3 s).
	QueryTimeout time.Duration
	// RetryBackoff is the wait after the first failed attempt to decide a
	// discarded message (database or broker unreachable). Recovery retries
	// in process until the message is decided or Shutdown: it never gives a
	// committed event up. The wait doubles after each failure up to
	// RetryMaxBackoff, each one drawn at random between half and all of
	// it. Default DefaultRetryBackoff (500 ms); negative is invalid.
	RetryBackoff time.Duration
	// RetryMaxBackoff caps the wait between attempts, and so how long
	// recovery may lag once its database is back. Default
	// DefaultRetryMaxBackoff (5 s, or RetryBackoff when that is larger);
	// must not be below RetryBackoff.
	RetryMaxBackoff time.Duration
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), the same in every rmqtx component: the zero value logs,
	// counts and traces nothing.
	observe.Observe
	// OnDecision, when set, is called after each attempt on a message of
	// the group (decided or failed). Default none.
	OnDecision func(Result)
	// Publisher overrides the republish producer (tests, tools). Default: a
	// producer created and owned by the Recovery, whose queue selector
	// routes by the message's sharding key (WIRE.md, "Queue routing"); an
	// override that should keep an aggregate's order needs the same.
	Publisher Publisher
}

// WithDefaults returns a copy of c with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.ConsumerGroup == "" && c.Group != "" {
		c.ConsumerGroup = c.Group + "-recovery"
	}
	if c.PublisherGroup == "" && c.Group != "" {
		c.PublisherGroup = c.Group + "-republish"
	}
	if c.InstanceName == "" {
		c.InstanceName = c.ConsumerGroup + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	}
	if c.StartRetry <= 0 {
		c.StartRetry = DefaultStartRetry
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = DefaultRetryBackoff
	}
	if c.RetryMaxBackoff == 0 {
		c.RetryMaxBackoff = max(DefaultRetryMaxBackoff, c.RetryBackoff)
	}
	c.Observe = c.Observe.WithDefaults()
	return c
}

// ErrConfig is wrapped by configuration errors.
var ErrConfig = errors.New("discard: invalid config")

func (c Config) validate() error {
	if err := rmqname.NameServers(c.NameServers); err != nil {
		return fmt.Errorf("%w: NameServers %w", ErrConfig, err)
	}
	switch {
	case c.Group == "":
		return fmt.Errorf("%w: Group is required", ErrConfig)
	case c.Log == nil:
		return fmt.Errorf("%w: Log is required", ErrConfig)
	case c.RetryBackoff < 0:
		return fmt.Errorf("%w: RetryBackoff %s is negative", ErrConfig, c.RetryBackoff)
	case c.RetryMaxBackoff < c.RetryBackoff:
		return fmt.Errorf("%w: RetryMaxBackoff %s is below RetryBackoff %s", ErrConfig, c.RetryMaxBackoff, c.RetryBackoff)
	}
	return nil
}
