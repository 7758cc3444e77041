package consumer

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/stmtcache"
	"github.com/rmqtx/rmqtx/metrics"
)

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
	// running holds the ids whose counted attempt is under way in this
	// process: another copy of such an event does not count (crash.go).
	running runningSet
	// windows are the crash-count windows of the queues this processor
	// was delivered from (window.go).
	windows windowSet
	// windowsOff: the window table is missing; every attempt is counted.
	windowsOff atomic.Bool
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
	insertLogNew                                                     string // set when the dialect records new keys with InsertNew
	preRead                                                          []string
	selectAttemptIDs                                                 string
	selectVersion, lockVersion, updateVersion                        string
	upsertAttempt, selectAttempt, deleteAttempt, upsertDeadLetterSQL string
	// countAttempt and recordCounted are crash counting's (crash.go).
	countAttempt, recordCounted string
	// readWindow and writeWindow are the crash-count window's (window.go).
	readWindow, writeWindow string
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
		failed: newFailedSet(failedSetSize), batchQueries: batchSQL{d: d, log: t.log, attempt: t.attempt}, tr: otelx.New(cfg.TracerProvider)}
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
		countAttempt:        countAttemptSQL(d, t.attempt),
		recordCounted: d.Upsert(t.attempt, "consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at",
			"?, ?, 1, ?, ?, "+now+", "+now, "consumer_group, event_id",
			"last_class = "+d.Excluded("last_class")+", last_error = "+d.Excluded("last_error")+", updated_at = "+now),
	}
	// Where the dialect prefers it (PostgreSQL), a new key is recorded with a
	// plain insert that skips an existing row; only a duplicate then costs
	// the locking read of its hash (selectLogHash).
	if d.NewKeysByInsertNew() {
		q.insertLogNew = d.InsertNew(t.log, "consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at",
			"?, ?, ?, ?, '"+StatusApplied+"', ?, "+now+", "+now, "consumer_group, event_id")
	}
	q.readWindow, q.writeWindow = windowSQL(d, t.window) // rebound there
	for _, iso := range d.IsolationExprs() {
		q.preRead = append(q.preRead, "SELECT request_hash AS h, "+iso+" AS iso FROM "+t.log+" WHERE consumer_group = ? AND event_id = ?")
	}
	for _, s := range []*string{&q.insertLog, &q.insertLogNew, &q.selectLogHash, &q.markStale, &q.setResultRef, &q.selectAttemptIDs,
		&q.selectVersion, &q.lockVersion, &q.updateVersion, &q.upsertAttempt, &q.selectAttempt, &q.deleteAttempt, &q.upsertDeadLetterSQL,
		&q.countAttempt, &q.recordCounted} {
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

// clip makes s valid UTF-8 of at most n characters, to fit its column.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}
