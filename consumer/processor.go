package consumer

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/wire"
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

// Result is what happened to one message.
type Result string

// Results. Every one but ResultRetry is ACKed.
const (
	ResultApplied   Result = "applied"   // effect committed with the dedup row
	ResultDuplicate Result = "duplicate" // dedup hit: same id, same hash; handler not run
	ResultConflict  Result = "conflict"  // same id, different hash: parked
	ResultStale     Result = "stale"     // older aggregate version: skipped, recorded
	ResultRetry     Result = "retry"     // rolled back; redeliver later (NOT ACKed)
	ResultParked    Result = "parked"    // stored as a dead letter
	ResultIgnored   Result = "ignored"   // unknown type under UnknownIgnore
)

// Outcome is the result of Processor.Process.
type Outcome struct {
	Result  Result
	EventID string
	// Class and Err describe the failure for ResultRetry, ResultParked and
	// ResultConflict.
	Class Class
	Err   error
	// Attempt is the number of failed attempts recorded so far (ResultRetry,
	// or a park after the retry limit).
	Attempt int
	// DelayLevel is the RocketMQ delay level for the redelivery (ResultRetry).
	DelayLevel int
	// DeadLetterID is the dead-letter row (ResultParked, ResultConflict).
	DeadLetterID int64
}

// Ack reports whether the message may be acknowledged: everything except a
// retry. Parking happens before Ack is true, never after.
func (o Outcome) Ack() bool { return o.Result != ResultRetry }

// Stats are the processor's counters since it was created.
type Stats struct {
	Applied    int64 // effects committed
	Duplicates int64 // dedup hits
	Conflicts  int64 // payload-hash conflicts parked
	Stale      int64 // stale versions skipped
	Gaps       int64 // strict-mode gap waits (each also counts as a retry)
	Retries    int64 // redeliveries requested
	Parked     int64 // dead letters written (conflicts included)
	Ignored    int64 // unknown types ignored
}

// Processor is the broker-independent core: it turns one delivered message
// into exactly one committed effect, a dedup hit, a stale skip, a retry or a
// dead letter. It is safe for concurrent use.
type Processor struct {
	cfg   ProcessorConfig
	db    *sqlx.DB
	d     dialect.Dialect
	t     tables
	q     queries
	cache *dedupCache // nil when disabled
	// stmts keeps the processor's statements prepared: one round trip each
	// whatever the DSN (package stmtcache).
	stmts *stmtcache.Cache
	// batchQueries are the batch mode's statements per batch size (batch.go).
	batchQueries batchSQL
	dups         dupWindow
	// failed holds the ids this process saw fail (their attempt rows are
	// deleted with their success or dedup hit).
	failed *failedSet
	// preRead is the index in q.preRead of the statement the storm
	// pre-read uses (one per isolation expression of the dialect); past the
	// last, it is disabled.
	preRead atomic.Int32
	stats   struct {
		applied, duplicates, conflicts, stale, gaps, retries, parked, ignored atomic.Int64
	}
	// tr traces Process (tracing.go); nil when tracing is off.
	tr *otelx.Tracer
}

type queries struct {
	insertLog, selectLogHash, markStale, setResultRef                string
	preRead                                                          []string
	selectAttemptIDs                                                 string
	selectVersion, lockVersion, updateVersion                        string
	upsertAttempt, selectAttempt, deleteAttempt, upsertDeadLetterSQL string
}

// NewProcessor validates cfg (after WithDefaults) and returns a Processor.
// It does not touch the database: the tables must exist (schema.MigrateAll).
func NewProcessor(cfg ProcessorConfig) (*Processor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t, _ := newTables(cfg.TablePrefix)
	d := dialect.Must(cfg.DB) // validate checked it
	p := &Processor{cfg: cfg, db: cfg.DB, d: d, t: t, q: newQueries(d, t), cache: newDedupCache(cfg.DedupCacheSize),
		failed: newFailedSet(failedSetSize), batchQueries: batchSQL{d: d, log: t.log}, tr: otelx.New(cfg.TracerProvider)}
	p.stmts = stmtcache.New(cfg.DB)
	stmtcache.CloseWith(p, p.stmts)
	return p, nil
}

// newQueries builds the processor's statements once, each passed through
// the dialect's Rebind.
func newQueries(d dialect.Dialect, t tables) queries {
	now := d.Now()
	q := queries{
		// A duplicate costs this one statement, not an error plus a SELECT:
		// on a duplicate key the existing row is locked and changed (the
		// change is rolled back at once), and the statement yields
		// dupSameHash when the stored hash is this one, dupOtherHash when not.
		insertLog: d.UpsertReturning(t.log, "consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at",
			"?, ?, ?, ?, '"+StatusApplied+"', ?, "+now+", "+now, "consumer_group, event_id",
			"retry_count = retry_count + 1",
			"CASE WHEN request_hash = ? THEN "+strconv.FormatInt(dupSameHash, 10)+" ELSE "+strconv.FormatInt(dupOtherHash, 10)+" END"),
		// Read inside the dedup transaction, which holds the row's lock: a
		// locking read returns the committed row whatever the isolation level.
		selectLogHash: "SELECT request_hash FROM " + t.log + " WHERE consumer_group = ? AND event_id = ? " + d.SharedLock(),
		markStale:     "UPDATE " + t.log + " SET status = '" + StatusStale + "' WHERE consumer_group = ? AND event_id = ?",
		setResultRef:  "UPDATE " + t.log + " SET result_ref = ? WHERE consumer_group = ? AND event_id = ?",
		selectVersion: "SELECT last_applied_version FROM " + t.version +
			" WHERE consumer_group = ? AND aggregate_type = ? AND aggregate_id = ? FOR UPDATE",
		lockVersion: d.Upsert(t.version, "consumer_group, aggregate_type, aggregate_id, last_applied_version, last_event_id, updated_at",
			"?, ?, ?, 0, '', "+now, "consumer_group, aggregate_type, aggregate_id", "last_applied_version = last_applied_version"),
		updateVersion: "UPDATE " + t.version + " SET last_applied_version = ?, last_event_id = ?, updated_at = " + now +
			" WHERE consumer_group = ? AND aggregate_type = ? AND aggregate_id = ?",
		upsertAttempt: d.Upsert(t.attempt, "consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at",
			"?, ?, 1, ?, ?, "+now+", "+now, "consumer_group, event_id",
			"attempts = attempts + 1, last_class = "+d.Excluded("last_class")+", last_error = "+d.Excluded("last_error")+", updated_at = "+now),
		selectAttempt:       "SELECT attempts FROM " + t.attempt + " WHERE consumer_group = ? AND event_id = ?",
		deleteAttempt:       "DELETE FROM " + t.attempt + " WHERE consumer_group = ? AND event_id = ?",
		selectAttemptIDs:    "SELECT event_id FROM " + t.attempt + " WHERE consumer_group = ? ORDER BY updated_at DESC LIMIT " + strconv.Itoa(failedSetSize),
		upsertDeadLetterSQL: upsertDeadLetter(d, t.dead),
	}
	for _, iso := range d.IsolationExprs() {
		q.preRead = append(q.preRead, "SELECT request_hash AS h, "+iso+" AS iso FROM "+t.log+" WHERE consumer_group = ? AND event_id = ?")
	}
	for _, s := range []*string{&q.insertLog, &q.selectLogHash, &q.markStale, &q.setResultRef, &q.selectAttemptIDs,
		&q.selectVersion, &q.lockVersion, &q.updateVersion, &q.upsertAttempt, &q.selectAttempt, &q.deleteAttempt, &q.upsertDeadLetterSQL} {
		*s = d.Rebind(*s)
	}
	for i := range q.preRead {
		q.preRead[i] = d.Rebind(q.preRead[i])
	}
	return q
}

// Values insertLog yields on a duplicate key (see newQueries).
const (
	dupSameHash  int64 = 1
	dupOtherHash int64 = 2
)

// Consume-log statuses.
const (
	StatusApplied = "SUCCESS" // the effect committed
	StatusStale   = "STALE"   // skipped as an older aggregate version
)

// Config returns the processor's configuration with defaults applied.
func (p *Processor) Config() ProcessorConfig { return p.cfg }

// DedupCacheStats returns a snapshot of the dedup cache's size and hits.
func (p *Processor) DedupCacheStats() DedupCacheStats { return p.cache.stats() }

// Stats returns a snapshot of the counters.
func (p *Processor) Stats() Stats {
	s := &p.stats
	return Stats{
		Applied: s.applied.Load(), Duplicates: s.duplicates.Load(), Conflicts: s.conflicts.Load(),
		Stale: s.stale.Load(), Gaps: s.gaps.Load(), Retries: s.retries.Load(),
		Parked: s.parked.Load(), Ignored: s.ignored.Load(),
	}
}

// loadFailed adds the event ids of the group's attempt rows to the set of
// ids seen failing, so that a process that starts (after a crash, or next to
// an instance that recorded them) deletes such a row when a first delivery of
// its event succeeds. Consumer.Start calls it; an error only loses the hint.
func (p *Processor) loadFailed(ctx context.Context) error {
	var ids []string
	if err := p.db.SelectContext(ctx, &ids, p.q.selectAttemptIDs, p.cfg.Group); err != nil {
		return fmt.Errorf("consumer: read attempts: %w", err)
	}
	for _, id := range ids {
		p.failed.add(id)
	}
	return nil
}

// DeadLetters returns a store over this processor's dead-letter table.
func (p *Processor) DeadLetters() *DeadLetterStore { return &DeadLetterStore{db: p.db, t: p.t, d: p.d} }

// Process handles one message: decode, dedup, guard, handle, commit - or
// classify the failure and retry or park. The caller ACKs the message only
// when the outcome's Ack() is true; by then everything is committed.
//
// With ProcessorConfig.TracerProvider it is a consume span, a child of the
// trace context the message carries, and the handler's ctx holds it.
func (p *Processor) Process(ctx context.Context, m Message) Outcome {
	ctx, sp := p.startConsumeSpan(ctx, m)
	o := p.process(ctx, m)
	endConsumeSpan(sp, o)
	return o
}

// process is Process without its span.
func (p *Processor) process(ctx context.Context, m Message) Outcome {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ProcessTimeout)
	defer cancel()
	it, out, ok := p.check(ctx, m)
	if !ok {
		return out
	}
	return p.apply(ctx, it)
}

// item is a message that passed check: its event and route, and its place
// in a batch (ProcessBatch). The transaction steps work on items.
type item struct {
	idx   int
	m     Message
	ev    Event
	route Route
}

// check runs what needs no transaction: decoding (or adoption), the
// declared payload hash, the route and Validate. It returns the item to
// apply, or the outcome a check decided (parked, ignored, retried) and false.
func (p *Processor) check(ctx context.Context, m Message) (item, Outcome, bool) {
	m, env, err := p.decode(m) // the wire format, or an adopted identity (adopt.go)
	if err != nil {
		ev := malformedEvent(m)
		return item{}, p.park(ctx, m, ev, ClassData, fmt.Errorf("%w: %w", ErrMalformed, err), "", 0), false
	}
	ev := Event{
		ID: env.EventID, Type: env.EventType, Version: env.EventVersion,
		AggregateType: env.AggregateType, AggregateID: env.AggregateID, AggregateVersion: env.AggregateVersion,
		BusinessKey: env.BusinessKey, Headers: env.Headers, Payload: m.Body,
		PayloadHash: wire.Hash(m.Body), Delivery: m.Delivery,
	}
	if declared := m.Properties[wire.PropPayloadHash]; declared != "" && wire.NormalizeHash(declared) != ev.PayloadHash {
		return item{}, p.park(ctx, m, ev, ClassData, fmt.Errorf("%w: payload hash %s does not match the declared %s", ErrMalformed, ev.PayloadHash, clip(declared, 64)), "", 0), false
	}
	route, ok := p.cfg.Routes[ev.Type]
	if !ok {
		if p.cfg.UnknownType == UnknownIgnore {
			p.stats.ignored.Add(1)
			p.count(ev, ResultIgnored)
			return item{}, Outcome{Result: ResultIgnored, EventID: ev.ID}, false
		}
		return item{}, p.park(ctx, m, ev, ClassData, fmt.Errorf("%w %q", ErrUnknownEventType, ev.Type), "", 0), false
	}
	if route.Validate != nil {
		if err := callValidate(route.Validate, ev); err != nil {
			c := handlerClass(err)
			if c == ClassUnknown {
				c = ClassData
			}
			return item{}, p.fail(ctx, m, ev, c, err), false
		}
	}
	return item{m: m, ev: ev, route: route}, Outcome{}, true
}

// apply runs one checked event alone. A redelivery this processor saw
// committed, with the same hash, is a dedup hit without the database; so,
// during a duplicate storm, is one whose committed dedup row a point read
// finds. Anything else takes its own transaction (applyTx), and the result
// step turns what the transaction decided into the outcome.
func (p *Processor) apply(ctx context.Context, it item) Outcome {
	ev := it.ev
	if p.cache.hit(ev.ID, ev.PayloadHash) {
		return p.duplicate(ctx, ev)
	}
	// While the database has mostly been answering "duplicate" (a replay
	// after a rebalance or a restart), a committed dedup row is looked up
	// first, outside any transaction: one point read instead of BEGIN,
	// INSERT, ROLLBACK. Only a committed row with this very hash is trusted;
	// a miss, another hash or an error takes the transaction.
	if p.dups.storm() && p.preReadHit(ctx, ev) {
		p.dups.record(true)
		p.cache.add(ev.ID, ev.PayloadHash)
		return p.duplicate(ctx, ev)
	}
	return p.result(ctx, it, p.applyTx(ctx, it))
}

// applyTx is one event's transaction: the dedup step, then the event's
// steps, then COMMIT when they applied the event or skipped it as stale.
// The transaction has ended (committed or rolled back) when applyTx
// returns, so the result step's writes on other connections never wait on
// its locks.
func (p *Processor) applyTx(ctx context.Context, it item) decision {
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return failed(ClassTransient, fmt.Errorf("consumer: begin: %w", err))
	}
	defer func() { _ = tx.Rollback() }() // after the commit: a no-op
	d, err := p.dedupStep(ctx, tx, it.ev)
	if err != nil {
		return failed(ClassTransient, err)
	}
	if d.state == evNew {
		d = p.eventSteps(ctx, tx, it)
	}
	if d.state == evApplied || d.state == evStale {
		// A commit error is ambiguous; the redelivery finds out (a dedup
		// hit if it did commit).
		if err := p.commit(tx); err != nil {
			return failed(ClassTransient, err)
		}
	}
	return d
}

// eventState is where one event stands in its transaction.
type eventState int

const (
	evNew       eventState = iota // dedup row inserted by this transaction: the event's steps run next
	evDuplicate                   // dedup row existed (its hash in decision.existing)
	evApplied                     // handler ran; the effect is in the transaction
	evStale                       // older version, marked stale in the transaction
	evFailed                      // the event failed; decision.class and err say why
)

// decision is what the transaction steps decided for one event; the
// result step (result) turns it into the Outcome once the transaction has
// ended. Single and batch mode share both.
type decision struct {
	state    eventState
	existing string // evDuplicate: the stored payload hash
	class    Class  // evFailed
	err      error  // evFailed
	gap      bool   // evFailed by a strict version gap
	last     int64  // evStale: the aggregate's last applied version
}

func failed(c Class, err error) decision { return decision{state: evFailed, class: c, err: err} }

// dedupStep inserts ev's dedup row, first in the transaction and in one
// statement: a concurrent delivery of the same event blocks on the row's
// lock until this transaction ends. On a duplicate key the statement locks
// the existing (committed) row and says whether its hash is ours; only
// another hash costs one more statement, a locking read of the stored one.
// An error is the transaction's (the caller fails the event or the batch).
func (p *Processor) dedupStep(ctx context.Context, tx *sqlx.Tx, ev Event) (decision, error) {
	inserted, v, err := p.d.ExecReturning(ctx, cached{p.stmts, tx}, p.q.insertLog,
		p.cfg.Group, ev.ID, ev.Type, ev.PayloadHash, ev.Delivery.ReconsumeTimes, ev.PayloadHash)
	if err != nil {
		return decision{}, fmt.Errorf("consumer: insert consume log: %w", err)
	}
	d := decision{state: evNew}
	switch {
	case inserted:
	case v == dupSameHash:
		d = decision{state: evDuplicate, existing: ev.PayloadHash}
	default:
		d.state = evDuplicate
		if err := p.stmts.TxGet(ctx, tx, &d.existing, p.q.selectLogHash, p.cfg.Group, ev.ID); err != nil {
			return decision{}, fmt.Errorf("consumer: read consume log: %w", err)
		}
	}
	p.dups.record(!inserted)
	return d, nil
}

// eventSteps runs the steps of an event whose dedup row this transaction
// inserted: the version guard, then the handler. A failure is the event's
// own (evFailed); the caller undoes what the steps wrote, by a rollback of
// the transaction or, in a batch, of the event's savepoint.
func (p *Processor) eventSteps(ctx context.Context, tx *sqlx.Tx, it item) decision {
	if d := p.guardStep(ctx, tx, it); d.state != evNew {
		return d
	}
	return p.handlerStep(ctx, tx, it)
}

// guardStep is the aggregate-version guard (I6). It locks the aggregate's
// version row, decides, and moves the version forward when the event
// applies (evNew: go on to the handler). A stale event is recorded STALE
// with its attempts cleared (evStale); a strict gap fails with class Wait.
// Two events of one aggregate serialize on that row. The row is created (or
// locked, if it exists) by one upsert that takes the exclusive lock at
// once: SELECT-then-INSERT would deadlock when several first events of one
// aggregate race (shared locks on the duplicate key, then each asks for an
// exclusive one). Version 0 means "none applied".
func (p *Processor) guardStep(ctx context.Context, tx *sqlx.Tx, it item) decision {
	ev, g := it.ev, p.cfg.Group
	mode := it.route.Version
	if mode == VersionInherit {
		mode = p.cfg.VersionMode
	}
	if mode == VersionNone || ev.AggregateType == "" || ev.AggregateVersion <= 0 {
		return decision{state: evNew}
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.q.lockVersion, g, ev.AggregateType, ev.AggregateID); err != nil {
		return failed(ClassTransient, fmt.Errorf("consumer: lock aggregate version: %w", err))
	}
	var last int64
	if err := p.stmts.TxGet(ctx, tx, &last, p.q.selectVersion, g, ev.AggregateType, ev.AggregateID); err != nil {
		return failed(ClassTransient, fmt.Errorf("consumer: read aggregate version: %w", err))
	}
	v := ev.AggregateVersion
	var stale, gap bool
	switch {
	case mode == VersionStrict && last == 0:
		stale, gap = v < p.cfg.StrictFirstVersion, v > p.cfg.StrictFirstVersion
	case v <= last:
		stale = true
	case mode == VersionStrict && v != last+1:
		gap = true
	}
	switch {
	case stale:
		if _, err := p.stmts.TxExec(ctx, tx, p.q.markStale, g, ev.ID); err != nil {
			return failed(ClassTransient, fmt.Errorf("consumer: mark stale: %w", err))
		}
		if err := p.clearAttemptsTx(ctx, tx, ev); err != nil {
			return failed(ClassTransient, err)
		}
		return decision{state: evStale, last: last}
	case gap:
		d := failed(ClassWait, fmt.Errorf("%w: %s/%s version %d", ErrVersionGap, ev.AggregateType, ev.AggregateID, v))
		d.gap = true
		return d
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.q.updateVersion, v, ev.ID, g, ev.AggregateType, ev.AggregateID); err != nil {
		return failed(ClassTransient, fmt.Errorf("consumer: update aggregate version: %w", err))
	}
	return decision{state: evNew}
}

// handlerStep runs the route's handler in the transaction, then records
// the result reference it set and clears the event's attempts, so the
// bookkeeping of earlier failures commits with the success, atomically.
func (p *Processor) handlerStep(ctx context.Context, tx *sqlx.Tx, it item) decision {
	h := &handling{}
	ev := it.ev
	ev.handling = h // this call's Event only: Validate's copy and it.ev have none
	err := callHandler(context.WithValue(ctx, handlingKey{}, h), it.route.Handler, tx, ev)
	ref := h.finish()
	if err != nil {
		return failed(handlerClass(err), err)
	}
	if ref != "" {
		if _, err := p.stmts.TxExec(ctx, tx, p.q.setResultRef, ref, p.cfg.Group, it.ev.ID); err != nil {
			return failed(ClassTransient, fmt.Errorf("consumer: set result ref: %w", err))
		}
	}
	if err := p.clearAttemptsTx(ctx, tx, it.ev); err != nil {
		return failed(ClassTransient, err)
	}
	return decision{state: evApplied}
}

// commit commits the transaction of one event or one batch.
func (p *Processor) commit(tx *sqlx.Tx) error {
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("consumer: commit: %w", err)
	}
	failpoint.Inject(failpoint.AfterConsumeCommit)
	return nil
}

// result is the last step, after the transaction has ended: it turns what
// the transaction decided for it.ev into the outcome, with what must follow
// a commit (the cache, the counters) or a rollback (the dedup hit, the
// conflict's dead letter, the failed attempt's retry or park).
func (p *Processor) result(ctx context.Context, it item, d decision) Outcome {
	ev, g := it.ev, p.cfg.Group
	switch d.state {
	case evApplied:
		p.failed.remove(ev.ID)
		p.cache.add(ev.ID, ev.PayloadHash) // only now: the effect is committed
		p.stats.applied.Add(1)
		p.count(ev, ResultApplied)
		if p.cfg.Metrics != nil && !ev.Delivery.StoredAt.IsZero() {
			p.cfg.Metrics.ConsumerLag.WithLabelValues(g).Observe(time.Since(ev.Delivery.StoredAt).Seconds())
		}
		return Outcome{Result: ResultApplied, EventID: ev.ID}
	case evStale:
		p.failed.remove(ev.ID)
		p.cache.add(ev.ID, ev.PayloadHash)
		p.stats.stale.Add(1)
		metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerStale }, g, p.typeLabel(ev))
		p.count(ev, ResultStale)
		p.logStale(ev, d.last)
		return Outcome{Result: ResultStale, EventID: ev.ID}
	case evDuplicate:
		if d.existing == ev.PayloadHash {
			p.cache.add(ev.ID, d.existing) // the row we locked is committed
			return p.duplicate(ctx, ev)
		}
		err := fmt.Errorf("%w: event %s applied with payload hash %s, redelivered with %s", ErrConflict, ev.ID, d.existing, ev.PayloadHash)
		return p.park(ctx, it.m, ev, ClassConflict, err, d.existing, 0)
	case evFailed:
		if d.gap {
			p.stats.gaps.Add(1)
			metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerGaps }, g, p.typeLabel(ev))
		}
		return p.fail(ctx, it.m, ev, d.class, d.err)
	}
	// evNew never leaves the transaction steps; fail safe if it does.
	return p.fail(ctx, it.m, ev, ClassTransient, fmt.Errorf("consumer: event %s left undecided", ev.ID))
}

// cached runs statements on tx (on the database when tx is nil) through
// the processor's prepared statements, for the dialect's ExecReturning.
type cached struct {
	c  *stmtcache.Cache
	tx *sqlx.Tx
}

func (r cached) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if r.tx == nil {
		return r.c.Exec(ctx, query, args...)
	}
	return r.c.TxExec(ctx, r.tx, query, args...)
}

func (r cached) QueryRowxContext(ctx context.Context, query string, args ...any) *sqlx.Row {
	if r.tx == nil {
		return r.c.DB().QueryRowxContext(ctx, query, args...)
	}
	return r.tx.QueryRowxContext(ctx, query, args...)
}

// mayHaveAttempts reports whether ev's event may have an attempt row, so
// that its success or dedup hit must delete it: a retry (ReconsumeTimes > 0:
// this very message failed before, here or on another instance), or an id
// this process saw fail or found failed at Consumer.Start (another copy of
// it failed; this copy is a first delivery). Any other first delivery - the
// common path - issues no delete at all: an attempt row exists only for
// events whose some copy failed, and that copy comes back as a retry, whose
// success or dedup hit deletes it (a process that crashed between recording
// the failure and answering the broker leaves it to the restarted process,
// which loads the ids at Start).
func (p *Processor) mayHaveAttempts(ev Event) bool {
	return ev.Delivery.ReconsumeTimes > 0 || p.failed.has(ev.ID)
}

// clearAttemptsTx deletes ev's attempt row, if it may have one, in the
// transaction that commits its success: the bookkeeping of the failures
// goes with the success, atomically.
func (p *Processor) clearAttemptsTx(ctx context.Context, tx *sqlx.Tx, ev Event) error {
	if !p.mayHaveAttempts(ev) {
		return nil
	}
	if _, err := p.stmts.TxExec(ctx, tx, p.q.deleteAttempt, p.cfg.Group, ev.ID); err != nil {
		return fmt.Errorf("consumer: clear attempts: %w", err)
	}
	return nil
}

// preReadHit reads the dedup row outside a transaction (the duplicate-storm
// shortcut) and reports whether it is committed with ev's hash. A plain read
// sees another transaction's uncommitted row when the session runs at READ
// UNCOMMITTED; ACKing on that row would lose the event if that transaction
// rolls back. So the same statement reads the session's isolation level, and
// at READ UNCOMMITTED the answer is not trusted and the pre-read is turned
// off for good (the transaction path, whose INSERT waits on the row lock,
// decides). A server that knows none of the dialect's isolation
// expressions turns it off too.
func (p *Processor) preReadHit(ctx context.Context, ev Event) bool {
	i := p.preRead.Load()
	off := int32(len(p.q.preRead))
	if i >= off {
		return false
	}
	var r struct {
		Hash      string `db:"h"`
		Isolation string `db:"iso"`
	}
	err := p.stmts.Get(ctx, &r, p.q.preRead[i], p.cfg.Group, ev.ID)
	switch {
	case err != nil && p.d.IsUnknownVariable(err):
		p.preRead.CompareAndSwap(i, i+1)
		return false
	case err != nil:
		return false
	case p.d.ReadUncommitted(r.Isolation):
		if p.preRead.Swap(off) != off {
			p.cfg.Logger.WithField("consumer_group", p.cfg.Group).
				Debug("consumer: sessions run at READ UNCOMMITTED; the duplicate-storm pre-read is off")
		}
		return false
	}
	return r.Hash == ev.PayloadHash
}

// duplicate counts and returns a dedup hit: the event's effect is committed
// with this payload hash, so the message is ACKed without the handler. The
// attempt row of an event that may have one is deleted first (a dedup hit
// has no transaction of its own to do it in).
func (p *Processor) duplicate(ctx context.Context, ev Event) Outcome {
	if p.mayHaveAttempts(ev) {
		bctx, cancel := bookkeeping(ctx)
		_, err := p.stmts.Exec(bctx, p.q.deleteAttempt, p.cfg.Group, ev.ID)
		cancel()
		if err != nil {
			// The next copy (or the restarted process) tries again.
			p.cfg.Logger.WithFields(p.fields(ev)).WithError(err).Warn("consumer: cannot clear the attempts of a duplicate")
		} else {
			p.failed.remove(ev.ID)
		}
	}
	p.stats.duplicates.Add(1)
	metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerDedupHits }, p.cfg.Group, p.typeLabel(ev))
	p.count(ev, ResultDuplicate)
	return Outcome{Result: ResultDuplicate, EventID: ev.ID}
}

// bookkeeping gives retry and park writes their own deadline: they must run
// even when the message's context has expired.
func bookkeeping(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// fail handles a failed attempt whose transaction has been rolled back.
func (p *Processor) fail(ctx context.Context, m Message, ev Event, c Class, err error) Outcome {
	if !c.Retryable() {
		return p.park(ctx, m, ev, c, err, "", 0)
	}
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	text := clip(p.cfg.RedactText(err.Error()), 2000)
	attempts := ev.Delivery.ReconsumeTimes + 1
	_, rerr := p.stmts.Exec(bctx, p.q.upsertAttempt, p.cfg.Group, ev.ID, string(c), text)
	p.failed.add(ev.ID) // even on an error: the row may have been written
	if rerr == nil {
		rerr = p.stmts.Get(bctx, &attempts, p.q.selectAttempt, p.cfg.Group, ev.ID)
	}
	limit := p.cfg.MaxRetries
	if c == ClassWait {
		limit = p.cfg.MaxWaits
	}
	if rerr == nil && attempts > limit {
		return p.park(ctx, m, ev, c, fmt.Errorf("%w (%d attempts): %w", ErrRetryLimit, attempts, err), "", attempts)
	}
	if rerr != nil {
		// Without the count the broker's reconsume limit still bounds it.
		p.cfg.Logger.WithFields(p.fields(ev)).WithError(rerr).Warn("consumer: cannot record a failed attempt")
	}
	level := p.cfg.DelayLevel(c, attempts)
	p.stats.retries.Add(1)
	metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerRetries }, p.cfg.Group, p.typeLabel(ev), string(c))
	res := ResultRetry
	if errors.Is(err, ErrVersionGap) {
		p.count(ev, "gap")
	} else {
		p.count(ev, res)
	}
	p.cfg.Logger.WithFields(p.fields(ev)).WithField("class", c).WithField("attempt", attempts).
		WithField("error", text).Debug("consumer: attempt failed, redelivery requested")
	return Outcome{Result: res, EventID: ev.ID, Class: c, Err: err, Attempt: attempts, DelayLevel: level}
}

// park stores a dead letter and returns an ACKable outcome, or a retry when
// the dead letter could not be stored (nothing is ACKed unstored).
func (p *Processor) park(ctx context.Context, m Message, ev Event, c Class, cause error, existingHash string, attempts int) Outcome {
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	payload := p.cfg.Redact(append([]byte(nil), ev.Payload...))
	redacted := !bytes.Equal(payload, ev.Payload)
	props, _ := json.Marshal(replayProperties(m.Properties))
	var existing any
	if existingHash != "" {
		existing = existingHash
	}
	text := clip(p.cfg.RedactText(cause.Error()), 8000)
	d := m.Delivery
	_, id, err := p.d.ExecReturning(bctx, cached{c: p.stmts}, p.q.upsertDeadLetterSQL,
		p.cfg.Group, clip(d.Topic, 255), d.QueueID, d.QueueOffset, clip(d.MsgID, 128), clip(ev.ID, 128),
		clip(ev.Type, 128), clip(ev.BusinessKey, 128), string(c), text, payload, redacted,
		ev.PayloadHash, existing, string(props), d.ReconsumeTimes)
	if err != nil {
		p.cfg.Logger.WithFields(p.fields(ev)).WithError(err).Error("consumer: cannot park a message; it will be redelivered")
		p.stats.retries.Add(1)
		metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerRetries }, p.cfg.Group, p.typeLabel(ev), string(ClassTransient))
		p.count(ev, ResultRetry)
		return Outcome{Result: ResultRetry, EventID: ev.ID, Class: ClassTransient, Err: fmt.Errorf("consumer: park: %w", err),
			Attempt: attempts, DelayLevel: p.cfg.DelayLevel(ClassTransient, max(attempts, d.ReconsumeTimes+1))}
	}
	if attempts > 0 || p.mayHaveAttempts(ev) {
		if _, err := p.stmts.Exec(bctx, p.q.deleteAttempt, p.cfg.Group, ev.ID); err == nil {
			p.failed.remove(ev.ID)
		}
	}
	p.stats.parked.Add(1)
	metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerDeadLetters }, p.cfg.Group, p.typeLabel(ev), string(c))
	result := ResultParked
	if c == ClassConflict {
		result = ResultConflict
		p.stats.conflicts.Add(1)
		metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerConflicts }, p.cfg.Group, p.typeLabel(ev))
	}
	p.count(ev, result)
	p.cfg.Logger.WithFields(p.fields(ev)).WithField("class", c).WithField("dead_letter_id", id).
		WithField("error", text).Warn("consumer: message parked as a dead letter")
	return Outcome{Result: result, EventID: ev.ID, Class: c, Err: cause, Attempt: attempts, DeadLetterID: id}
}

// upsertDeadLetter parks a message: a new row, or, for the same message
// parked again (group, event id, payload hash), the existing row updated
// with the latest delivery and error, its park count raised, and a
// discarded one kept discarded. Either way the statement yields the row's
// id.
func upsertDeadLetter(d dialect.Dialect, table string) string {
	set := []string{}
	for _, c := range []string{"topic", "queue_id", "queue_offset", "msg_id", "error_class", "error_text", "payload",
		"payload_redacted", "existing_hash", "properties", "reconsume_times"} {
		set = append(set, c+" = "+d.Excluded(c))
	}
	set = append(set, "park_count = park_count + 1",
		"status = CASE WHEN status = '"+DeadLetterDiscarded+"' THEN status ELSE '"+DeadLetterParked+"' END",
		"last_seen_at = "+d.Now())
	return d.UpsertReturning(table,
		"consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key,"+
			" error_class, error_text, payload, payload_redacted, request_hash, existing_hash, properties, reconsume_times,"+
			" park_count, status, first_seen_at, last_seen_at",
		"?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, '"+DeadLetterParked+"', "+d.Now()+", "+d.Now(),
		"consumer_group, event_id, request_hash", strings.Join(set, ", "), "id")
}

// replayProperties keeps what a replay needs to re-publish the message with
// its original identity: the rmqtx envelope and headers, keys and tags, and
// the trace context (so a retry or a replay stays linked to its trace).
func replayProperties(props map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range props {
		switch {
		case k == propReconsume:
		case strings.HasPrefix(k, "RMQTX_"), strings.HasPrefix(k, wire.HeaderPrefix), k == "KEYS", k == "TAGS",
			k == otelx.PropTraceparent, k == otelx.PropTracestate:
			out[k] = v
		}
	}
	return out
}

// malformedEvent builds what can be known of a message whose envelope does
// not decode, for the dead letter. Its id falls back to "msgid:<msg id>".
func malformedEvent(m Message) Event {
	id := m.Properties[wire.PropEventID]
	if id == "" || len(id) > wire.MaxIDLen || !utf8.ValidString(id) {
		msgID := m.Delivery.MsgID
		if msgID == "" {
			msgID = wire.Hash(m.Body)[:32]
		}
		id = "msgid:" + msgID
	}
	return Event{
		ID:          id,
		Type:        m.Properties[wire.PropEventType],
		BusinessKey: m.Properties[wire.PropBusinessKey],
		Payload:     m.Body,
		PayloadHash: wire.Hash(m.Body),
		Delivery:    m.Delivery,
	}
}

func (p *Processor) typeLabel(ev Event) string {
	if _, ok := p.cfg.Routes[ev.Type]; ok {
		return ev.Type
	}
	return "_unrouted" // bounded label values: never an arbitrary type from the wire
}

func (p *Processor) count(ev Event, r Result) {
	metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerProcessed }, p.cfg.Group, p.typeLabel(ev), string(r))
}

func (p *Processor) fields(ev Event) logrus.Fields {
	return logrus.Fields{"consumer_group": p.cfg.Group, "event_id": ev.ID, "event_type": ev.Type,
		"topic": ev.Delivery.Topic, "queue_id": ev.Delivery.QueueID, "queue_offset": ev.Delivery.QueueOffset}
}

func callHandler(ctx context.Context, h Handler, tx *sqlx.Tx, ev Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrHandlerPanic, r)
		}
	}()
	return h(ctx, tx, ev)
}

func callValidate(v func(Event) error, ev Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = BadData(fmt.Errorf("validate panicked: %v", r))
		}
	}()
	return v(ev)
}

// clip makes s valid UTF-8 of at most n characters, to fit its column.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}
