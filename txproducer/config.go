package txproducer

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// Defaults.
const (
	DefaultSendTimeout    = 3 * time.Second
	DefaultSendRetries    = 2
	DefaultLocalTxTimeout = 30 * time.Second
	DefaultCheckTimeout   = checkback.DefaultQueryTimeout
	DefaultFenceAge       = checkback.DefaultFenceAge
	// DefaultBrokerWatchInterval: see Config.BrokerWatchInterval.
	DefaultBrokerWatchInterval = 2 * time.Second
	// DefaultMaxPayloadBytes leaves 64 KiB of the broker's default 4 MiB
	// maxMessageSize for properties. It is wire.MaxPayloadBytes, the limit
	// outbox.Enqueue applies too.
	DefaultMaxPayloadBytes = wire.MaxPayloadBytes
)

// Config configures a Producer.
type Config struct {
	// NameServers lists name server addresses (host:port). Required; the
	// client's default resolver (an HTTP lookup) is never used.
	NameServers []string
	// Group is the transactional producer group. Required. Use it for this
	// producer only: the broker sends checks to any live member of the
	// group, and a normal producer sharing it collides (client #998).
	Group string
	// InstanceName is the client instance name. Default Group+"-"+a random
	// suffix, new for every Producer: the client shares one connection per
	// instance name in a process, and a shared one can drop checks.
	InstanceName string
	// DB is the database of the local transactions and the txlog. Required
	// (unless Log is set, whose database it then is). Its pool must allow at
	// least 2 connections (a check runs while a local transaction holds one).
	DB *sqlx.DB
	// Log is the transaction log. Default: txlog.New(DB, TablePrefix). When
	// set, it must be built on DB (the same *sql.DB): the txlog row is
	// written inside DB's local transaction and checks read it through Log,
	// so two databases would let a check miss a committed row (I3). New
	// rejects a Log on another handle.
	Log *txlog.Store
	// TablePrefix for the default Log. Default txlog.DefaultPrefix.
	TablePrefix string
	// SendTimeout bounds sending the half message (per attempt). Default 3 s.
	SendTimeout time.Duration
	// SendRetries is how often the client retries a failed half send.
	// Default 2. Set -1 for none.
	SendRetries int
	// LocalTxTimeout bounds the local transaction (the caller's function
	// and the COMMIT), counted from the moment the broker stored the half
	// message. BEGIN and the txlog INSERT overlap the half's send, but time
	// spent waiting for the broker (SendTimeout per attempt, SendRetries
	// attempts) is not charged to it: a Send that waited out a dead broker
	// and stored its half on another still gets the whole budget, and one
	// whose half was never stored fails with ErrSend (RetryWithSameID).
	// Default 30 s. Keep it below FenceAge so checks rarely wait on a
	// running one.
	LocalTxTimeout time.Duration
	// CheckTimeout bounds one check answer and the producer's own short
	// txlog statements. Default 3 s.
	CheckTimeout time.Duration
	// FenceAge: a check that finds no txlog row for a half message older
	// than this fences it (see package checkback). Default 60 s, which fits
	// the broker's defaults. Start reads every master broker's
	// transactionTimeOut, transactionCheckInterval and transactionCheckMax
	// and checks FenceAge + interval < timeout + (max-1) x interval: when it
	// does not hold, Start fails with a *BrokerSettingsError if
	// DisableRecovery is set (nothing would resolve the halves the broker
	// discards before a check could fence them), and logs a warning
	// otherwise (recovery resolves them from the txlog). A broker whose
	// settings cannot be read is logged at Info and not checked.
	FenceAge time.Duration
	// MaxPayloadBytes rejects larger payloads before sending. Default
	// DefaultMaxPayloadBytes (4 MiB - 64 KiB).
	MaxPayloadBytes int
	// DisablePayloadStorage keeps payloads out of the txlog (only the hash
	// is stored). Default false: payloads are stored so that discard
	// recovery and tooling can publish a committed event again. What it
	// gives up: a committed event whose half message the broker discards
	// (transactionCheckMax reached) is not republished; recovery records
	// the NO_PAYLOAD decision, logs an error and counts it
	// (rmqtx_checkback_discard_recoveries_total{decision="no_payload"}), and
	// an operator must publish it again from the business data.
	DisablePayloadStorage bool
	// Resolver is asked by checks when no txlog row exists. Default none.
	Resolver checkback.Resolver
	// WarmupTopics are probed on Start with a half message that is rolled
	// back, which teaches the client every broker with queues of the
	// topic; Start then heartbeats those brokers and confirms that each
	// registered this instance, so they send it checks before its first
	// Send (a restarted instance otherwise receives none until it sends).
	// On a cluster, list topics that together have queues on every master
	// broker: Start warns about a master that serves none of them.
	// Default none.
	WarmupTopics []string
	// BrokerWatchInterval is how often the producer asks the name server
	// for the cluster's brokers (one GET_BROKER_CLUSTER_INFO) while all is
	// well. It is the fallback: the producer also holds one idle
	// connection to every master, learns at once when a master's closes,
	// then dials it every 100 ms and, on the first accepted connection (a
	// restarted broker accepts before its first check pass), heartbeats it
	// directly and asks whether it lists this instance. While a master is
	// away it asks the name server every 500 ms, so a slave the controller
	// promotes is seen within a second; it heartbeats the slaves every
	// 30 s, so a promoted slave lists this instance already. Without this
	// a restarted or promoted broker knows no instance of the group until
	// the client's next route refresh and heartbeat (up to 30 s), and its
	// checks in between fail and count toward transactionCheckMax. Default
	// 2 s. Negative: do not watch. See rejoin.go.
	BrokerWatchInterval time.Duration
	// DisableRecovery does not start discard recovery (discard.Recovery)
	// with the producer. Default false.
	DisableRecovery bool
	// RecoveryStartRetry: see discard.Config.StartRetry. Default 5 s.
	RecoveryStartRetry time.Duration
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), the same in every rmqtx component: the zero value logs,
	// counts and traces nothing.
	observe.Observe
	// OnCheck, when set, is called after every check answer. Default none.
	OnCheck func(checkback.Answer)
	// OnRecovery, when set, is called after every recovery decision. Default none.
	OnRecovery func(discard.Result)
	// Test holds hooks for tests; leave it zero.
	Test TestHooks
}

// TestHooks are seams for tests. They are never set in production.
type TestHooks struct {
	// BeforeLocalTx runs before the local transaction's BEGIN. BEGIN and
	// the txlog INSERT overlap the half message's send, so the half may not
	// be stored yet when it runs; the COMMIT waits for both. Its ctx is the
	// transaction's, which gets LocalTxTimeout's deadline only once the
	// half is stored.
	BeforeLocalTx func(ctx context.Context, eventID string)
	// HalfStored runs once the client has the broker's answer that the
	// half is stored, before the local transaction's clock starts; the
	// local transaction's COMMIT waits for it. A half can be visible on the
	// broker before then (the answer is still on its way), so a test that
	// stops the broker right after finding a half there uses this to know
	// the Send has it.
	HalfStored func(eventID string)
	// LoseEnd, when it returns true for a Send's event id, makes the
	// producer end that Send's half with UNKNOWN whatever its local
	// outcome (which is persisted as usual): to the broker this is an
	// END_TRANSACTION that was lost, so it checks the half later.
	LoseEnd func(eventID string) bool
	// Now, when set, is the host clock Start compares with the
	// database's (checkClock), in place of time.Now: a skewed clock.
	Now func() time.Time
}

// WithDefaults returns a copy of c with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.InstanceName == "" && c.Group != "" {
		c.InstanceName = c.Group + "-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	}
	if c.TablePrefix == "" {
		c.TablePrefix = txlog.DefaultPrefix
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = DefaultSendTimeout
	}
	if c.SendRetries == 0 {
		c.SendRetries = DefaultSendRetries
	} else if c.SendRetries < 0 {
		c.SendRetries = 0
	}
	if c.LocalTxTimeout <= 0 {
		c.LocalTxTimeout = DefaultLocalTxTimeout
	}
	if c.CheckTimeout <= 0 {
		c.CheckTimeout = DefaultCheckTimeout
	}
	if c.FenceAge <= 0 {
		c.FenceAge = DefaultFenceAge
	}
	if c.MaxPayloadBytes <= 0 {
		c.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if c.BrokerWatchInterval == 0 {
		c.BrokerWatchInterval = DefaultBrokerWatchInterval
	}
	if c.RecoveryStartRetry <= 0 {
		c.RecoveryStartRetry = discard.DefaultStartRetry
	}
	c.Observe = c.Observe.WithDefaults()
	return c
}

func (c Config) validate() error {
	if err := rmqname.NameServers(c.NameServers); err != nil {
		return wrapf(ErrConfig, "NameServers %v", err)
	}
	if err := rmqname.Group(c.Group); err != nil {
		return wrapf(ErrConfig, "Group %v", err)
	}
	if c.DB == nil && c.Log == nil {
		return wrapf(ErrConfig, "DB is required")
	}
	if c.DB != nil && c.Log != nil && c.Log.DB().DB != c.DB.DB {
		return wrapf(ErrConfig, "Log: its database handle is not DB; the txlog must be in the database of the local transaction (pass DB alone, or a Log built on DB)")
	}
	if err := sqlname.ValidatePrefix(c.TablePrefix); err != nil {
		return wrapf(ErrConfig, "TablePrefix: %v", err)
	}
	if c.MaxPayloadBytes > 4<<20 {
		return wrapf(ErrConfig, "MaxPayloadBytes %d is above the broker's default 4 MiB message limit", c.MaxPayloadBytes)
	}
	for _, t := range c.WarmupTopics {
		if err := rmqname.Topic(t); err != nil {
			return wrapf(ErrConfig, "WarmupTopics %v", err)
		}
	}
	return nil
}

func (c Config) store() (*txlog.Store, error) {
	if c.Log != nil {
		return c.Log, nil
	}
	s, err := txlog.New(c.DB, c.TablePrefix)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return s, nil
}
