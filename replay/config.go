package replay

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/wire"
)

// DefaultPrefix is the prefix of the consumer tables and of the audit
// tables unless configured (an empty prefix means it): the one rmqtx
// default (internal/sqlname).
const DefaultPrefix = sqlname.DefaultPrefix

// DefaultTablePrefix is the old name of DefaultPrefix.
//
// Deprecated: use DefaultPrefix.
const DefaultTablePrefix = DefaultPrefix

// Properties a replay adds to each message (beside the original envelope).
const (
	PropAuditID      = wire.PropReplayPrefix + "AUDIT_ID"       // replay_audit.id of the run
	PropOperator     = wire.PropReplayPrefix + "OPERATOR"       // who ran it
	PropCount        = wire.PropReplayPrefix + "COUNT"          // 1 for the first replay of this dead letter
	PropDeadLetterID = wire.PropReplayPrefix + "DEAD_LETTER_ID" // dead_letter.id replayed
	PropGroup        = wire.PropReplayPrefix + "GROUP"          // consumer group that parked it
)

// Sentinel errors. Every error this package returns wraps one of them or a
// database/broker error, and starts with "replay: ".
var (
	ErrConfig     = errors.New("replay: invalid config")
	ErrRequest    = errors.New("replay: invalid request")
	ErrNotStarted = errors.New("replay: not started")
	ErrClosed     = errors.New("replay: closed")
)

// Config configures a Replayer.
type Config struct {
	// DB holds the consumer's dead-letter table and the audit tables.
	// Required.
	DB *sqlx.DB
	// TablePrefix of the consumer tables and of <prefix>replay_audit.
	// Default DefaultPrefix ("rmqtx_"); validated with sqlname.
	TablePrefix string
	// NameServers lists the name server addresses (host:port). Required for
	// Start and Replay (not for DryRun); the client's default HTTP resolver
	// is never used.
	NameServers []string
	// Group is the producer group of the replayer's normal producer.
	// Default "rmqtx_replay". Keep it apart from transactional groups (#998).
	Group string
	// InstanceName of the producer client. Default
	// "rmqtx-replay-<pid>-<random>", unique per Replayer.
	InstanceName string
	// Rate is the default messages per second (a Request may lower or raise
	// it). Default 10. Must be > 0: a replay is never unthrottled.
	Rate float64
	// Batch is the default number of messages between two new-dead-letter
	// checks. Default 10.
	Batch int
	// StopAfterNewDeadLetters stops a replay, after the batch in progress,
	// once this many dead letters were parked (or parked again) since it
	// started, in the consumer group it replays (all groups when the
	// selector names none). Default 10; negative disables the check.
	StopAfterNewDeadLetters int
	// MaxMessages caps how many dead letters one run selects when the
	// Selector gives no Limit. Default 1000.
	MaxMessages int
	// SendTimeout bounds one send. Default 5s.
	SendTimeout time.Duration
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), the same in every rmqtx component: the zero value logs,
	// counts and traces nothing.
	observe.Observe
	// Test holds test-only hooks. Leave zero in production.
	Test TestConfig
}

// TestConfig holds hooks for tests.
type TestConfig struct {
	// AfterBatch runs after each batch is sent, before the new-dead-letter
	// check (batch counts from 1).
	AfterBatch func(batch int)
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultPrefix
	}
	if c.Group == "" {
		c.Group = "rmqtx_replay"
	}
	if c.InstanceName == "" {
		c.InstanceName = fmt.Sprintf("rmqtx-replay-%d-%s", os.Getpid(), randHex(6))
	}
	if c.Rate == 0 {
		c.Rate = 10
	}
	if c.Batch == 0 {
		c.Batch = 10
	}
	if c.StopAfterNewDeadLetters == 0 {
		c.StopAfterNewDeadLetters = 10
	}
	if c.MaxMessages == 0 {
		c.MaxMessages = 1000
	}
	if c.SendTimeout == 0 {
		c.SendTimeout = 5 * time.Second
	}
	c.Observe = c.Observe.WithDefaults()
	return c
}

func (c Config) validate() error {
	if c.DB == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	if err := sqlname.ValidatePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("%w: TablePrefix: %w", ErrConfig, err)
	}
	if len(c.NameServers) > 0 {
		if err := rmqname.NameServers(c.NameServers); err != nil {
			return fmt.Errorf("%w: NameServers %w", ErrConfig, err)
		}
	}
	for _, f := range []struct {
		name     string
		negative bool
	}{
		{"Rate", c.Rate < 0}, {"Batch", c.Batch < 0}, {"MaxMessages", c.MaxMessages < 0}, {"SendTimeout", c.SendTimeout < 0},
	} {
		if f.negative {
			return fmt.Errorf("%w: %s must not be negative", ErrConfig, f.name)
		}
	}
	return nil
}
