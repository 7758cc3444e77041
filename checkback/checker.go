package checkback

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/rmqmsg"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// PropProbe marks the warm-up half messages a producer sends on Start. They
// never carry an event id and are always rolled back.
const PropProbe = "RMQTX_PROBE"

// Defaults.
const (
	DefaultFenceAge     = 60 * time.Second
	DefaultQueryTimeout = 3 * time.Second
)

// Decision is a check answer.
type Decision int

// Decisions. Unknown asks the broker to check again later.
const (
	Unknown Decision = iota
	Commit
	Rollback
)

func (d Decision) String() string {
	switch d {
	case Commit:
		return "commit"
	case Rollback:
		return "rollback"
	default:
		return "unknown"
	}
}

// LocalTransactionState converts d for the client (through the broker seam).
func (d Decision) LocalTransactionState() rmqmsg.LocalTransactionState {
	switch d {
	case Commit:
		return broker.CommitMessageState
	case Rollback:
		return broker.RollbackMessageState
	default:
		return broker.UnknownState
	}
}

// FromState maps a txlog state to a decision.
func FromState(s txlog.State) Decision {
	switch s {
	case txlog.StateCommitted:
		return Commit
	case txlog.StateRolledBack:
		return Rollback
	default:
		return Unknown
	}
}

// Reason says why a check was answered the way it was.
type Reason string

// Reasons.
const (
	ReasonFound        Reason = "found"         // a txlog row existed
	ReasonHashMismatch Reason = "hash-mismatch" // a COMMITTED row with another payload: not this half
	ReasonOtherHalf    Reason = "other-half"    // a COMMITTED row that another half message committed
	ReasonResolver     Reason = "resolver"      // the Resolver decided (and it was persisted)
	ReasonYoung        Reason = "young"         // no row, younger than the fence age
	ReasonFenced       Reason = "fenced"        // no row, fenced (or the local tx finished while we waited)
	ReasonProbe        Reason = "probe"         // a warm-up probe
	ReasonNoEventID    Reason = "no-event-id"   // not an rmqtx message
	ReasonError        Reason = "error"         // a query failed or timed out
	ReasonPanic        Reason = "panic"         // a resolver or store panicked
)

// Query describes the transaction being checked.
type Query struct {
	EventID     string
	Group       string
	Topic       string
	Tags        string
	Keys        string
	EventType   string
	BusinessKey string
	PayloadHash string // RMQTX_PAYLOAD_SHA256 of the half message
	// HalfKey is the half message's UNIQ_KEY (the client's message id,
	// which the broker keeps through every check and discard). It tells
	// the half that committed a row from the others with its event id.
	HalfKey    string
	BornAt     time.Time // producer clock when the half was sent
	Properties map[string]string
}

// QueryFromMessage builds a Query from a check request's message. Topic is
// REAL_TOPIC as the broker set it on the half message; it is left empty for
// a message that came back through a consumer retry (Redelivered), because
// the broker then rewrites REAL_TOPIC to the retry topic.
func QueryFromMessage(m *rmqmsg.MessageExt) Query {
	topic := m.Topic
	if rt := m.GetProperty(broker.PropRealTopic); rt != "" {
		topic = rt
	}
	if Redelivered(m) {
		topic = ""
	}
	var born time.Time
	if m.BornTimestamp > 0 {
		born = time.UnixMilli(m.BornTimestamp)
	}
	return Query{
		EventID:     m.GetProperty(wire.PropEventID),
		Group:       m.GetProperty(broker.PropProducerGroup),
		Topic:       topic,
		Tags:        m.GetTags(),
		Keys:        m.GetKeys(),
		EventType:   m.GetProperty(wire.PropEventType),
		BusinessKey: m.GetProperty(wire.PropBusinessKey),
		PayloadHash: m.GetProperty(wire.PropPayloadHash),
		HalfKey:     m.GetProperty(broker.PropUniqKey),
		BornAt:      born,
		Properties:  m.GetProperties(),
	}
}

// Redelivered reports whether m came back through a consumer retry (the
// broker's delay queue and a %RETRY% topic) rather than straight from the
// topic it was stored in. The broker rewrites REAL_TOPIC of such a message
// to the retry topic.
func Redelivered(m *rmqmsg.MessageExt) bool {
	if m.ReconsumeTimes > 0 || m.GetProperty(broker.PropRetryTopic) != "" {
		return true
	}
	rt := m.GetProperty(broker.PropRealTopic)
	return strings.HasPrefix(rt, "%RETRY%") || strings.HasPrefix(rt, "%DLQ%")
}

// Several half messages can carry one event id: a Send retried with the
// same id, two Sends racing, a Send after a crash. Only one of them
// committed, and the txlog row says which: txproducer stores that half's
// UNIQ_KEY with the row's properties. Any other half must never become a
// copy of the event: a check answers it ROLLBACK, and discard recovery
// (package discard) drops it.

// CommittedHalf returns the UNIQ_KEY of the half message whose local
// transaction wrote row, or "" when the row does not say (fence and
// resolver rows, rows written before rmqtx recorded it).
func CommittedHalf(row txlog.Row) string { return row.Half() }

// OtherHalf reports whether the half message whose UNIQ_KEY is halfKey is
// not the one that committed row: row is COMMITTED and records another
// half's UNIQ_KEY. It never decides from an absence: a row that records no
// half, or a half without a UNIQ_KEY, is not "other".
func OtherHalf(row txlog.Row, halfKey string) bool {
	if row.State != txlog.StateCommitted || halfKey == "" {
		return false
	}
	committed := CommittedHalf(row)
	return committed != "" && committed != halfKey
}

// Answer is the outcome of one check.
type Answer struct {
	EventID  string
	Decision Decision
	Reason   Reason
	Age      time.Duration // age of the half message (negative: producer clock ahead)
	Duration time.Duration // time taken to answer
	Err      error         // set with ReasonError and ReasonPanic
}

// Resolver decides a transaction that has no txlog row, from business
// data. Return Unknown to fall back to the fence-age rule. A Commit or
// Rollback is persisted in the txlog (ResolvedBy RESOLVER) before it is
// answered, and what the row then says is the answer.
type Resolver interface {
	Resolve(ctx context.Context, q Query) (Decision, error)
}

// ResolverFunc adapts a function to Resolver.
type ResolverFunc func(ctx context.Context, q Query) (Decision, error)

// Resolve calls f.
func (f ResolverFunc) Resolve(ctx context.Context, q Query) (Decision, error) { return f(ctx, q) }

// Log is the part of *txlog.Store the checker uses.
type Log interface {
	Get(ctx context.Context, id string) (txlog.Row, error)
	Record(ctx context.Context, r txlog.Row) (txlog.Row, bool, error)
	Fence(ctx context.Context, r txlog.Row) (txlog.Row, bool, error)
}

// Config configures a Checker.
type Config struct {
	// Log is the transaction log (a *txlog.Store). Required.
	Log Log
	// Group is the producer group, for fence rows and metric labels. Required.
	Group string
	// FenceAge is how old a half message with no txlog row must be before a
	// check fences it. Default DefaultFenceAge (60 s). See the package doc
	// for how it must relate to the broker's settings.
	FenceAge time.Duration
	// QueryTimeout bounds each check (all its queries together). Default
	// DefaultQueryTimeout (3 s). Checks are answered one at a time.
	QueryTimeout time.Duration
	// Resolver is asked when no row exists. Default none.
	Resolver Resolver
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), the same in every rmqtx component: the zero value logs,
	// counts and traces nothing.
	observe.Observe
	// OnAnswer, when set, is called after every answer, on the check
	// goroutine; it must be fast. Default none.
	OnAnswer func(Answer)
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// WithDefaults returns a copy of c with defaults filled in.
func (c Config) WithDefaults() Config {
	if c.FenceAge <= 0 {
		c.FenceAge = DefaultFenceAge
	}
	if c.QueryTimeout <= 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	c.Observe = c.Observe.WithDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// ErrConfig is wrapped by configuration errors.
var ErrConfig = errors.New("checkback: invalid config")

func (c Config) validate() error {
	if c.Log == nil {
		return fmt.Errorf("%w: Log is required", ErrConfig)
	}
	if c.Group == "" {
		return fmt.Errorf("%w: Group is required", ErrConfig)
	}
	return nil
}

// Checker answers transaction checks for one producer group.
type Checker struct {
	cfg Config
	tr  *otelx.Tracer // nil: tracing off
}

// New returns a Checker.
func New(cfg Config) (*Checker, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Checker{cfg: cfg, tr: otelx.New(cfg.TracerProvider)}, nil
}

// FenceAge returns the configured fence age.
func (c *Checker) FenceAge() time.Duration { return c.cfg.FenceAge }

// Check answers a check request for m. It never panics and returns within
// about QueryTimeout.
func (c *Checker) Check(ctx context.Context, m *rmqmsg.MessageExt) Answer {
	if m == nil {
		return c.CheckQuery(ctx, Query{})
	}
	if m.GetProperty(PropProbe) != "" {
		a := Answer{Decision: Rollback, Reason: ReasonProbe}
		c.finish(&a, c.cfg.Now())
		return a
	}
	ctx, sp := c.tr.StartFromMessage(ctx, &m.Message, otelx.SpanCheck, trace.SpanKindServer, otelx.Attrs{Group: c.cfg.Group})
	a := c.CheckQuery(ctx, QueryFromMessage(m))
	endCheck(sp, a)
	return a
}

// CheckQuery answers a check described by q.
func (c *Checker) CheckQuery(ctx context.Context, q Query) (a Answer) {
	start := c.cfg.Now()
	a = Answer{EventID: q.EventID}
	defer func() {
		if p := recover(); p != nil {
			a.Decision, a.Reason = Unknown, ReasonPanic
			a.Err = fmt.Errorf("checkback: panic while checking %s: %v", q.EventID, rmqlog.ScrubValue(p))
			c.cfg.Logger.WithField("event_id", q.EventID).WithField("stack", string(debug.Stack())).Error(a.Err.Error())
		}
		c.finish(&a, start)
	}()
	if q.EventID == "" {
		a.Reason = ReasonNoEventID
		return a
	}
	if !q.BornAt.IsZero() {
		a.Age = start.Sub(q.BornAt)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.QueryTimeout)
	defer cancel()

	row, err := c.cfg.Log.Get(ctx, q.EventID)
	switch {
	case err == nil && txlog.Retakable(row, q.HalfKey):
		// The id was rolled back for another half; a Send retrying the id
		// may be committing it with this half now (txlog.Store.Retake).
		// The row says nothing about this half: decide as if it had none.
		return c.undecided(ctx, a, q)
	case err == nil:
		return c.fromRow(a, row, q, ReasonFound)
	case !errors.Is(err, txlog.ErrNotFound):
		return c.failed(a, err)
	}

	if c.cfg.Resolver != nil {
		d, err := c.cfg.Resolver.Resolve(ctx, q)
		if err != nil {
			return c.failed(a, fmt.Errorf("checkback: resolver: %w", err))
		}
		if d == Commit || d == Rollback {
			r := c.rowFor(q, txlog.ByResolver)
			r.State = txlog.StateRolledBack
			if d == Commit {
				r.State = txlog.StateCommitted
			}
			row, _, err := c.cfg.Log.Record(ctx, r)
			if err != nil {
				return c.failed(a, err)
			}
			return c.fromRow(a, row, q, ReasonResolver)
		}
	}

	return c.undecided(ctx, a, q)
}

// undecided answers for a half that no row decides: UNKNOWN while it is
// younger than FenceAge, after that a fence (which waits on a local
// transaction or a retake still in flight) and what the row then says.
func (c *Checker) undecided(ctx context.Context, a Answer, q Query) Answer {
	// Clock skew: a negative age (producer clock ahead of ours) counts as
	// young; the transaction is fenced once our clock passes born+FenceAge,
	// or recovery handles it if the broker discards it first.
	if q.BornAt.IsZero() || a.Age < c.cfg.FenceAge {
		// Without a born time the age is unknown: never guess, never fence.
		a.Reason = ReasonYoung
		return a
	}
	row, fenced, err := c.cfg.Log.Fence(ctx, c.rowFor(q, txlog.ByFence))
	if err != nil {
		return c.failed(a, err)
	}
	if fenced {
		metrics.Inc(c.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.CheckbackFences }, c.cfg.Group)
		c.cfg.Logger.WithFields(logrus.Fields{"event_id": q.EventID, "topic": q.Topic, "age": a.Age.String()}).
			Warn("checkback: fenced a transaction with no txlog row past the fence age")
	}
	return c.fromRow(a, row, q, ReasonFenced)
}

func (c *Checker) rowFor(q Query, by txlog.ResolvedBy) txlog.Row {
	return txlog.Row{
		EventID: q.EventID, ProducerGroup: c.cfg.Group, Topic: q.Topic, Tags: q.Tags, Keys: q.Keys,
		EventType: q.EventType, BusinessKey: q.BusinessKey, PayloadHash: q.PayloadHash, ResolvedBy: by,
		// The row names the half it decides: a Send of that half that
		// comes late can never take the id over (txlog.Retakable), and
		// other halves of the id are not decided by it.
		Properties: txlog.HalfProperties(q.HalfKey),
	}
}

func (c *Checker) fromRow(a Answer, row txlog.Row, q Query, reason Reason) Answer {
	a.Decision, a.Reason = FromState(row.State), reason
	if a.Decision == Commit && OtherHalf(row, q.HalfKey) {
		// Another half with this event id committed; that one delivers the
		// event, and a COMMIT here would store it a second time.
		a.Decision, a.Reason = Rollback, ReasonOtherHalf
		c.cfg.Logger.WithFields(logrus.Fields{"event_id": q.EventID, "half": q.HalfKey}).
			Info("checkback: half message is not the one that committed; rolling it back")
		return a
	}
	if a.Decision == Commit && q.PayloadHash != "" && row.PayloadHash != "" && q.PayloadHash != row.PayloadHash {
		// Same event id, different payload: this half is not the one that
		// committed (a reused id whose local tx failed on the duplicate key).
		a.Decision, a.Reason = Rollback, ReasonHashMismatch
		c.cfg.Logger.WithField("event_id", q.EventID).Warn("checkback: half message payload differs from the committed row; rolling it back")
	}
	return a
}

func (c *Checker) failed(a Answer, err error) Answer {
	a.Decision, a.Reason, a.Err = Unknown, ReasonError, err
	c.cfg.Logger.WithField("event_id", a.EventID).WithError(err).Warn("checkback: check answered UNKNOWN after an error")
	return a
}

func (c *Checker) finish(a *Answer, start time.Time) {
	a.Duration = c.cfg.Now().Sub(start)
	if m := c.cfg.Metrics; m != nil {
		m.CheckbackAnswers.WithLabelValues(c.cfg.Group, a.Decision.String()).Inc()
		m.CheckbackDuration.Observe(a.Duration.Seconds())
	}
	if c.cfg.OnAnswer != nil {
		func() {
			defer func() {
				if p := recover(); p != nil {
					c.cfg.Logger.Errorf("checkback: OnAnswer panicked: %v", rmqlog.ScrubValue(p))
				}
			}()
			c.cfg.OnAnswer(*a)
		}()
	}
}
