package consumer

import (
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/observe"
)

// VersionMode selects the aggregate-version guard (I6).
type VersionMode int

const (
	// VersionInherit: in a Route, use ProcessorConfig.VersionMode; in
	// ProcessorConfig, the default, VersionStrict.
	VersionInherit VersionMode = iota
	// VersionNone: no guard; events apply in any order.
	VersionNone
	// VersionStrict: only last+1 applies. A gap (a later version arriving
	// first) is retried with class Wait up to MaxWaits, then parked; an older
	// or equal version is skipped as stale.
	VersionStrict
	// VersionMonotonic: any newer version applies; an older or equal one is
	// skipped as stale (ACKed, counted, recorded with status STALE).
	VersionMonotonic
)

func (m VersionMode) String() string {
	switch m {
	case VersionInherit:
		return "inherit"
	case VersionNone:
		return "none"
	case VersionStrict:
		return "strict"
	case VersionMonotonic:
		return "monotonic"
	}
	return fmt.Sprintf("VersionMode(%d)", int(m))
}

// UnknownTypePolicy says what happens to an event type with no Route.
type UnknownTypePolicy int

const (
	// UnknownPark parks it with class data (the default): nothing is lost
	// silently, and an operator can replay it once a handler exists.
	UnknownPark UnknownTypePolicy = iota
	// UnknownIgnore ACKs it without a trace except a counter (result
	// "ignored"): for groups that subscribe to a shared topic on purpose.
	UnknownIgnore
)

// Route is how one event type is handled.
type Route struct {
	// Handler applies the effect. Required.
	Handler Handler
	// Validate, when set, runs before the transaction (decode the payload,
	// check required fields). An unclassified error is class data: parked on
	// the first attempt, never retried. A classified error keeps its class.
	Validate func(ev Event) error
	// Version overrides ProcessorConfig.VersionMode for this type. Default
	// VersionInherit.
	Version VersionMode
	// Adopt, when set, applies messages of this type (by tag) that carry no
	// RMQTX_EVENT_ID, instead of ProcessorConfig.Adopt. See Adoption.
	Adopt *Adoption
}

// ProcessorConfig configures the idempotent processing core.
type ProcessorConfig struct {
	// Group is the consumer group: the dedup scope. Required.
	Group string
	// DB holds the consume log and the business tables (one local
	// transaction covers both). Required. The dedup decisions see committed
	// rows only at any session isolation level; the handler's own reads
	// follow the session's level (READ COMMITTED or REPEATABLE READ advised).
	DB *sqlx.DB
	// TablePrefix of the consumer tables. Default DefaultPrefix
	// ("rmqtx_"); validated with sqlname.
	TablePrefix string
	// Routes maps an event type to its Route. At least one is required.
	Routes map[string]Route
	// UnknownType is the policy for types without a route. Default UnknownPark.
	UnknownType UnknownTypePolicy
	// Adopt, when set, applies messages that other clients wrote without
	// rmqtx's envelope: the event id from a property, the keys or UNIQ_KEY,
	// the type from the tag (see Adoption, WIRE.md). Default nil: a message
	// without RMQTX_EVENT_ID is parked as malformed.
	Adopt *Adoption
	// VersionMode is the guard for events that carry an aggregate type and a
	// version > 0. Default VersionStrict (I6: a gap is waited for, not
	// skipped). Use VersionMonotonic when producers may skip versions.
	VersionMode VersionMode
	// StrictFirstVersion is the version strict mode expects for an aggregate
	// it has never seen. Default 1.
	StrictFirstVersion int64
	// MaxRetries bounds transient and unknown failures per event: the event
	// is parked on failure number MaxRetries+1. Default 10; negative means 0
	// (park on the first failure).
	MaxRetries int
	// NoCrashCount turns off the attempt counted before each handler run.
	// By default a delivery that reaches the database path and may be the
	// redelivery of a handler that ended its process counts its attempt in
	// the consume_attempt table, in its own committed statement, before the
	// handler runs; the success's transaction deletes the row. A handler
	// that ends its process (a crash, os.Exit, an OOM kill) leaves no error
	// to classify, and its redelivery looks like a first delivery, so only
	// this count sees it: once an event's attempts exceed MaxRetries and the
	// last one crashed, it is parked with class ClassCrash instead of
	// running again (in batch mode an event whose last attempt crashed runs
	// alone). Which deliveries count: retries, messages built without
	// MessageFromExt, and first deliveries at or below their queue's
	// crash-count window (the consume_window table: the highest offset any
	// process may have started a handler on, which each process commits
	// 128 offsets ahead: a read and a write per 128 deliveries of a queue).
	// Other first deliveries cost nothing, and the first crash of such a
	// message is seen as the window only, so it is parked after
	// MaxRetries+2 crashes. After a restart or a rebalance, up to 128
	// deliveries per queue count. A counted delivery costs two statements
	// (the count, and its delete in the transaction); in batch mode two per
	// batch whatever its size (one count for its counted events, one delete
	// in its transaction), three when some of its events had an attempt row
	// already (the read of those that crashed; MySQL only). A copy of an
	// event whose counted attempt runs in this process does not count. With NoCrashCount such an event is redelivered for as long as
	// it crashes.
	NoCrashCount bool
	// MaxWaits bounds Wait failures (business waits and strict version gaps)
	// the same way. Default 20; negative means 0.
	MaxWaits int
	// DelayLevel picks the RocketMQ delay level (1 = 1s, 2 = 5s, 3 = 10s,
	// 4 = 30s, 5 = 1m, ... with the broker's default messageDelayLevel) for
	// the redelivery after failed attempt number attempt (1-based). Default
	// DefaultDelayLevel.
	DelayLevel func(c Class, attempt int) int
	// ProcessTimeout bounds one message's transaction, handler included.
	// Default 30s.
	ProcessTimeout time.Duration
	// DedupCacheSize bounds the in-memory cache of recently committed
	// (event id, request hash) pairs of this group. A redelivery found there
	// with the same hash is ACKed as a dedup hit with no database round trip;
	// one with another hash takes the database path (conflicts are decided
	// there). Entries are added only after a commit (or a database dedup hit
	// that read the committed row), never for a failed or rolled-back attempt,
	// and the oldest is evicted first. About 200 bytes per entry. Default
	// DefaultDedupCacheSize (10000); negative disables the cache.
	DedupCacheSize int
	// Redact turns a payload into what a dead letter stores (I10). Default
	// RedactPayload: nothing is stored, so a dead letter holds no business
	// data (an operator finds the payload where it was produced, e.g. the
	// txlog or outbox row of the same event id). Opt out with KeepPayload to
	// store it as delivered, which a replay needs; or give a hook that masks
	// the sensitive fields. When the stored bytes differ from the delivered
	// ones the dead letter records payload_redacted = true and is not
	// replayable (DeadLetter.Replayable). Payloads are never logged.
	Redact func(payload []byte) []byte
	// RedactText is applied to error texts before they are logged or stored
	// (handler errors may quote data). Default: unchanged.
	RedactText func(string) string
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), the same in every rmqtx component: the zero value logs,
	// counts and traces nothing.
	observe.Observe
}

// RedactPayload is the default ProcessorConfig.Redact: a dead letter stores
// no payload at all (only its hash, request_hash, and the envelope).
func RedactPayload([]byte) []byte { return nil }

// KeepPayload is the ProcessorConfig.Redact that opts out of redaction: the
// dead letter stores the payload as delivered, so a replay can re-publish it.
// Use it only where the dead-letter table may hold the business data.
func KeepPayload(payload []byte) []byte { return payload }

// DefaultDelayLevel is the default retry schedule: Transient and Unknown
// failures back off 1s, 5s, 10s, 30s, 1m, 2m, ... up to level 14 (10m);
// Wait failures use the same ladder but stop growing at level 5 (1m).
func DefaultDelayLevel(c Class, attempt int) int {
	capLevel := 14
	if c == ClassWait {
		capLevel = 5
	}
	return max(1, min(attempt, capLevel))
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c ProcessorConfig) WithDefaults() ProcessorConfig {
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultPrefix
	}
	if c.VersionMode == VersionInherit {
		c.VersionMode = VersionStrict
	}
	if c.StrictFirstVersion == 0 {
		c.StrictFirstVersion = 1
	}
	switch {
	case c.MaxRetries == 0:
		c.MaxRetries = 10
	case c.MaxRetries < 0:
		c.MaxRetries = 0
	}
	switch {
	case c.MaxWaits == 0:
		c.MaxWaits = 20
	case c.MaxWaits < 0:
		c.MaxWaits = 0
	}
	if c.DelayLevel == nil {
		c.DelayLevel = DefaultDelayLevel
	}
	if c.DedupCacheSize == 0 {
		c.DedupCacheSize = DefaultDedupCacheSize
	}
	if c.ProcessTimeout <= 0 {
		c.ProcessTimeout = 30 * time.Second
	}
	if c.Redact == nil {
		c.Redact = RedactPayload
	}
	if c.RedactText == nil {
		c.RedactText = func(s string) string { return s }
	}
	c.Observe = c.Observe.WithDefaults()
	return c
}

func (c ProcessorConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if c.Group == "" {
		return bad("Group is required")
	}
	if len(c.Group) > 255 {
		return bad("Group is longer than 255 bytes")
	}
	if c.DB == nil {
		return bad("DB is required")
	}
	if _, err := dialect.For(c.DB); err != nil {
		return fmt.Errorf("%w: DB: %w", ErrConfig, err)
	}
	if len(c.Routes) == 0 {
		return bad("Routes is empty")
	}
	for t, r := range c.Routes {
		if t == "" {
			return bad("Routes: a route has an empty event type")
		}
		if r.Handler == nil {
			return bad("Routes[%q].Handler is required", t)
		}
		if r.Version < VersionInherit || r.Version > VersionMonotonic {
			return bad("Routes[%q].Version: unknown VersionMode %d", t, r.Version)
		}
	}
	if c.VersionMode < VersionNone || c.VersionMode > VersionMonotonic {
		return bad("VersionMode: unknown VersionMode %d", c.VersionMode)
	}
	if c.UnknownType != UnknownPark && c.UnknownType != UnknownIgnore {
		return bad("UnknownType: unknown UnknownTypePolicy %d", c.UnknownType)
	}
	if err := c.validateAdoption(); err != nil {
		return err
	}
	if err := sqlname.ValidatePrefix(c.TablePrefix); err != nil {
		return bad("TablePrefix: %v", err)
	}
	return nil
}
