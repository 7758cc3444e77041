package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/txlog"
)

// DefaultPrefix is the prefix of every rmqtx table unless configured (an
// empty prefix means it): the one rmqtx default (internal/sqlname).
const DefaultPrefix = sqlname.DefaultPrefix

// DefaultTablePrefix is the old name of DefaultPrefix.
//
// Deprecated: use DefaultPrefix.
const DefaultTablePrefix = DefaultPrefix

// ErrConfig is wrapped by configuration errors; ErrNotFound when nothing is
// known about an event id, business key or dead-letter id.
var (
	ErrConfig   = errors.New("inspect: invalid config")
	ErrNotFound = errors.New("inspect: not found")
)

// Config configures an Inspector.
type Config struct {
	// DB holds the rmqtx tables. Required.
	DB *sqlx.DB
	// TablePrefix of all rmqtx tables. Default DefaultPrefix.
	TablePrefix string
	// Redact renders payloads. Default Hidden(): sizes only, since the
	// inspector's output ends up on screens, in tickets and in chat. Showing
	// any payload bytes (ShowPrefix, Clear) is an explicit, risky opt-out.
	Redact Redactor
	// RedactText is applied to stored error texts and notes before they are
	// returned. Default: unchanged (the consumer already applied its own
	// RedactText when it stored them).
	RedactText func(string) string
	// Broker, when set, is asked for the broker's own record of an event.
	// Default nil: database tables only.
	Broker BrokerLookup
	// Now returns the current time for ages. Default time.Now.
	Now func() time.Time
}

// Inspector reads rmqtx's tables (and optionally the broker) for humans. It
// never writes.
//
// It reads each table through its owner: the owner names the table, its
// columns and states, and writes the queries (txlog.Store, outbox.Table,
// consumer.TableNames, replay.TableNames); this package only renders.
type Inspector struct {
	cfg     Config
	t       struct{ txlog, outbox, consume, attempt, dead, audit, item string }
	txlog   *txlog.Store
	outbox  outbox.Table
	consume consumer.TableNames
	replays replay.TableNames
	dead    *consumer.DeadLetterStore // every dead-letter read
	d       dialect.Dialect           // tells a missing table apart
}

// New validates cfg and returns an Inspector.
func New(cfg Config) (*Inspector, error) {
	if cfg.DB == nil {
		return nil, fmt.Errorf("%w: DB is required", ErrConfig)
	}
	if cfg.TablePrefix == "" {
		cfg.TablePrefix = DefaultPrefix
	}
	if err := sqlname.ValidatePrefix(cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: TablePrefix: %w", ErrConfig, err)
	}
	if cfg.Redact == nil {
		cfg.Redact = Hidden()
	}
	if cfg.RedactText == nil {
		cfg.RedactText = func(s string) string { return s }
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	dead, err := consumer.NewDeadLetterStore(cfg.DB, cfg.TablePrefix)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	d, err := dialect.For(cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	i := &Inspector{cfg: cfg, dead: dead, d: d}
	if i.txlog, err = txlog.New(cfg.DB, cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if i.outbox, err = outbox.NewTable(cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if i.consume, err = consumer.Tables(cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if i.replays, err = replay.Tables(cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	i.t.txlog, i.t.outbox, i.t.consume, i.t.attempt = i.txlog.Table(), i.outbox.Name(), i.consume.ConsumeLog, i.consume.Attempt
	i.t.dead, i.t.audit, i.t.item = i.consume.DeadLetter, i.replays.Audit, i.replays.AuditItem
	return i, nil
}

// TxlogRow is a transaction-log row as shown to humans.
type TxlogRow struct {
	EventID          string     `db:"event_id" json:"event_id"`
	ProducerGroup    string     `db:"producer_group" json:"producer_group"`
	Topic            string     `db:"topic" json:"topic"`
	Tags             string     `db:"tags" json:"tags"`
	Keys             string     `db:"msg_keys" json:"keys"`
	EventType        string     `db:"event_type" json:"event_type"`
	State            string     `db:"state" json:"state"`
	Payload          string     `db:"-" json:"payload"`
	PayloadHash      string     `db:"payload_hash" json:"payload_hash"`
	BusinessKey      string     `db:"business_key" json:"business_key"`
	CreatedAt        time.Time  `db:"created_at" json:"created_at"`
	ResolvedAt       time.Time  `db:"resolved_at" json:"resolved_at"`
	ResolvedBy       string     `db:"resolved_by" json:"resolved_by"`
	RecoveredAt      *time.Time `db:"recovered_at" json:"recovered_at,omitempty"`
	RecoveryDecision *string    `db:"recovery_decision" json:"recovery_decision,omitempty"`
	RecoveryNote     *string    `db:"recovery_note" json:"recovery_note,omitempty"`
	RawPayload       []byte     `db:"payload" json:"-"`
}

// OutboxRow is an outbox row as shown to humans.
type OutboxRow struct {
	EventID          string     `db:"event_id" json:"event_id"`
	AggregateType    string     `db:"aggregate_type" json:"aggregate_type"`
	AggregateID      string     `db:"aggregate_id" json:"aggregate_id"`
	AggregateVersion int64      `db:"aggregate_version" json:"aggregate_version"`
	EventType        string     `db:"event_type" json:"event_type"`
	Destination      string     `db:"destination" json:"destination"`
	MessageKey       string     `db:"message_key" json:"message_key"`
	Payload          string     `db:"-" json:"payload"`
	Status           string     `db:"status" json:"status"`
	OwnerToken       *string    `db:"owner_token" json:"owner_token,omitempty"`
	LeaseUntil       *time.Time `db:"lease_until" json:"lease_until,omitempty"`
	RetryCount       int        `db:"retry_count" json:"retry_count"`
	NextRetryAt      time.Time  `db:"next_retry_at" json:"next_retry_at"`
	LastErrorCode    *string    `db:"last_error_code" json:"last_error_code,omitempty"`
	LastErrorMessage *string    `db:"last_error_message" json:"last_error_message,omitempty"`
	CreatedAt        time.Time  `db:"created_at" json:"created_at"`
	SentAt           *time.Time `db:"sent_at" json:"sent_at,omitempty"`
	UpdatedAt        time.Time  `db:"updated_at" json:"updated_at"`
	RawPayload       []byte     `db:"payload" json:"-"`
}

// ConsumeRow is a consume-log (dedup) row, as its owner reads it.
type ConsumeRow = consumer.ConsumeLogRow

// AttemptRow is a failed-attempt row of an event not applied yet, as its
// owner reads it.
type AttemptRow = consumer.AttemptRow

// DeadLetterRow is a dead letter as shown to humans.
type DeadLetterRow struct {
	ID              int64             `db:"id" json:"id"`
	ConsumerGroup   string            `db:"consumer_group" json:"consumer_group"`
	Topic           string            `db:"topic" json:"topic"`
	QueueID         int               `db:"queue_id" json:"queue_id"`
	QueueOffset     int64             `db:"queue_offset" json:"queue_offset"`
	MsgID           string            `db:"msg_id" json:"msg_id"`
	EventID         string            `db:"event_id" json:"event_id"`
	EventType       string            `db:"event_type" json:"event_type"`
	BusinessKey     string            `db:"business_key" json:"business_key"`
	ErrorClass      string            `db:"error_class" json:"error_class"`
	ErrorText       string            `db:"error_text" json:"error_text"`
	Payload         string            `db:"-" json:"payload"`
	PayloadRedacted bool              `db:"payload_redacted" json:"payload_redacted"`
	RequestHash     string            `db:"request_hash" json:"request_hash"`
	ExistingHash    *string           `db:"existing_hash" json:"existing_hash,omitempty"`
	Properties      map[string]string `db:"-" json:"properties,omitempty"`
	ReconsumeTimes  int               `db:"reconsume_times" json:"reconsume_times"`
	ParkCount       int               `db:"park_count" json:"park_count"`
	Status          string            `db:"status" json:"status"`
	FirstSeenAt     time.Time         `db:"first_seen_at" json:"first_seen_at"`
	LastSeenAt      time.Time         `db:"last_seen_at" json:"last_seen_at"`
	ReplayCount     int               `db:"replay_count" json:"replay_count"`
	ReplayedAt      *time.Time        `db:"replayed_at" json:"replayed_at,omitempty"`
	ResolvedAt      *time.Time        `db:"resolved_at" json:"resolved_at,omitempty"`
	ResolutionNote  *string           `db:"resolution_note" json:"resolution_note,omitempty"`
	RawPayload      []byte            `db:"payload" json:"-"`
	RawProperties   string            `db:"properties" json:"-"`
}

// ReplayRow is one replay of the event (replay_audit_item joined with its
// run), as its owner reads it.
type ReplayRow = replay.EventReplayRow

// EventView is everything known about one event id.
type EventView struct {
	EventID     string          `json:"event_id"`
	Txlog       *TxlogRow       `json:"txlog"`
	Outbox      *OutboxRow      `json:"outbox"`
	Consumed    []ConsumeRow    `json:"consumed"`
	Attempts    []AttemptRow    `json:"attempts"`
	DeadLetters []DeadLetterRow `json:"dead_letters"`
	Replays     []ReplayRow     `json:"replays"`
	// Broker is the broker's record found by key (nil when no lookup is
	// configured); BrokerErrors lists lookups that failed, by topic.
	Broker       []BrokerMessage   `json:"broker,omitempty"`
	BrokerErrors map[string]string `json:"broker_errors,omitempty"`
	// Missing lists tables that do not exist in this database.
	Missing []string `json:"missing_tables,omitempty"`
}

// Found reports whether any table knows the event.
func (v EventView) Found() bool {
	return v.Txlog != nil || v.Outbox != nil || len(v.Consumed) > 0 || len(v.Attempts) > 0 ||
		len(v.DeadLetters) > 0 || len(v.Broker) > 0
}

func (i *Inspector) isMissingTable(err error) bool { return err != nil && i.d.IsMissingTable(err) }

// read takes the error of one owner read, recording a missing table
// instead of failing.
func (i *Inspector) read(missing *[]string, table string, err error) error {
	if i.isMissingTable(err) {
		if missing != nil && !slices.Contains(*missing, table) {
			*missing = append(*missing, table)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("inspect: read %s: %w", table, err)
	}
	return nil
}

// orEmpty returns s, or an empty slice for nil (JSON [] rather than null).
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// Event returns the cross-table view of one event id: its txlog and outbox
// rows, consume-log rows and failed attempts per group, dead letters,
// replays, and (with Config.Broker) the broker's messages keyed by it.
// A view where nothing is found wraps ErrNotFound.
func (i *Inspector) Event(ctx context.Context, id string) (EventView, error) {
	v := EventView{EventID: id}
	switch tr, err := i.txlog.Get(ctx, id); {
	case errors.Is(err, txlog.ErrNotFound):
	case i.isMissingTable(err):
		v.Missing = append(v.Missing, i.t.txlog)
	case err != nil:
		return v, fmt.Errorf("inspect: read %s: %w", i.t.txlog, err)
	default:
		v.Txlog = i.txlogView(tr)
	}
	switch or, err := i.outbox.Get(ctx, i.cfg.DB, id); {
	case errors.Is(err, outbox.ErrNotFound):
	case i.isMissingTable(err):
		v.Missing = append(v.Missing, i.t.outbox)
	case err != nil:
		return v, fmt.Errorf("inspect: read %s: %w", i.t.outbox, err)
	default:
		v.Outbox = i.outboxView(or)
	}
	var err error
	v.Consumed, err = i.consume.ConsumeLogByEvent(ctx, i.cfg.DB, id)
	if err := i.read(&v.Missing, i.t.consume, err); err != nil {
		return v, err
	}
	v.Attempts, err = i.consume.AttemptsByEvent(ctx, i.cfg.DB, id)
	if err := i.read(&v.Missing, i.t.attempt, err); err != nil {
		return v, err
	}
	for k := range v.Attempts {
		v.Attempts[k].LastError = i.cfg.RedactText(v.Attempts[k].LastError)
	}
	dl, err := i.deadLetters(ctx, &v.Missing, consumer.DeadLetterFilter{EventID: id})
	if err != nil {
		return v, err
	}
	v.DeadLetters = dl
	v.Replays, err = i.replays.ReplaysByEvent(ctx, i.cfg.DB, id)
	if err := i.read(&v.Missing, i.t.item, err); err != nil {
		return v, err
	}
	for k := range v.Replays {
		v.Replays[k].Reason = i.cfg.RedactText(v.Replays[k].Reason)
	}
	if i.cfg.Broker != nil {
		i.lookupBroker(ctx, &v)
	}
	v.Consumed, v.Attempts, v.DeadLetters, v.Replays = orEmpty(v.Consumed), orEmpty(v.Attempts), orEmpty(v.DeadLetters), orEmpty(v.Replays)
	sort.Strings(v.Missing)
	if !v.Found() {
		return v, fmt.Errorf("%w: event %q", ErrNotFound, id)
	}
	return v, nil
}

func (i *Inspector) lookupBroker(ctx context.Context, v *EventView) {
	topics := map[string]bool{}
	if v.Txlog != nil && v.Txlog.Topic != "" {
		topics[v.Txlog.Topic] = true
		topics[HalfTopic] = true
		topics[DiscardTopic] = true
	}
	if v.Outbox != nil && v.Outbox.Destination != "" {
		topics[v.Outbox.Destination] = true
	}
	for _, d := range v.DeadLetters {
		topics[d.Topic] = true
	}
	names := make([]string, 0, len(topics))
	for t := range topics {
		names = append(names, t)
	}
	sort.Strings(names)
	v.Broker = []BrokerMessage{}
	for _, t := range names {
		ms, err := i.cfg.Broker.QueryByKey(ctx, t, v.EventID, 32)
		if err != nil {
			if errors.Is(err, ErrTopicNotFound) && (t == HalfTopic || t == DiscardTopic) {
				continue // never used on this broker: nothing there
			}
			if v.BrokerErrors == nil {
				v.BrokerErrors = map[string]string{}
			}
			v.BrokerErrors[t] = err.Error()
		}
		v.Broker = append(v.Broker, ms...)
	}
}

func (i *Inspector) text(s *string) *string {
	if s == nil {
		return nil
	}
	r := i.cfg.RedactText(*s)
	return &r
}

// deadLetters reads the dead letters f selects (default limit 100), every
// column, payloads and texts redacted.
func (i *Inspector) deadLetters(ctx context.Context, missing *[]string, f consumer.DeadLetterFilter) ([]DeadLetterRow, error) {
	dls, err := i.dead.List(ctx, f)
	if err := i.read(missing, i.t.dead, err); err != nil {
		return nil, err
	}
	rows := make([]DeadLetterRow, len(dls))
	for k, d := range dls {
		r := DeadLetterRow{ID: d.ID, ConsumerGroup: d.ConsumerGroup, Topic: d.Topic, QueueID: d.QueueID, QueueOffset: d.QueueOffset,
			MsgID: d.MsgID, EventID: d.EventID, EventType: d.EventType, BusinessKey: d.BusinessKey, ErrorClass: string(d.ErrorClass),
			ErrorText: i.cfg.RedactText(d.ErrorText), Payload: i.cfg.Redact(d.Payload), PayloadRedacted: d.PayloadRedacted,
			RequestHash: d.RequestHash, Properties: d.Properties, ReconsumeTimes: d.ReconsumeTimes, ParkCount: d.ParkCount,
			Status: d.Status, FirstSeenAt: d.FirstSeenAt, LastSeenAt: d.LastSeenAt, ReplayCount: d.ReplayCount,
			ReplayedAt: d.ReplayedAt, ResolvedAt: d.ResolvedAt}
		if d.ExistingHash != "" {
			h := d.ExistingHash
			r.ExistingHash = &h
		}
		if d.ResolutionNote != "" {
			r.ResolutionNote = i.text(&d.ResolutionNote)
		}
		rows[k] = r
	}
	return rows, nil
}

// BusinessKey returns the views of the events carrying business key key
// (found through the txlog, the outbox's message key and the dead letters),
// oldest event id first, at most limit (default 20).
func (i *Inspector) BusinessKey(ctx context.Context, key string, limit int) ([]EventView, error) {
	if limit <= 0 {
		limit = 20
	}
	var ids []string
	var missing []string
	for _, q := range []struct {
		table string
		ids   func() ([]string, error)
	}{
		{i.t.txlog, func() ([]string, error) { return i.txlog.EventIDsByBusinessKey(ctx, key, limit) }},
		{i.t.outbox, func() ([]string, error) { return i.outbox.EventIDsByMessageKey(ctx, i.cfg.DB, key, limit) }},
		{i.t.dead, func() ([]string, error) { return i.consume.DeadLetterEventIDsByBusinessKey(ctx, i.cfg.DB, key, limit) }},
	} {
		got, err := q.ids()
		if err := i.read(&missing, q.table, err); err != nil {
			return nil, err
		}
		for _, id := range got {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	sort.Strings(ids)
	if len(ids) > limit {
		ids = ids[:limit]
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%w: business key %q", ErrNotFound, key)
	}
	out := make([]EventView, 0, len(ids))
	for _, id := range ids {
		v, err := i.Event(ctx, id)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return out, err
		}
		out = append(out, v)
	}
	return out, nil
}

// DeadLetterFilter selects dead letters for DeadLetters; zero fields do not
// filter. It means what consumer.DeadLetterFilter means.
type DeadLetterFilter struct {
	IDs           []int64 // id is one of these
	ConsumerGroup string
	Topic         string // original topic
	Status        string
	EventType     string
	BusinessKey   string
	ErrorClass    string
	Since, Until  time.Time // first_seen_at range [Since, Until)
	Limit         int       // default 100
}

// DeadLetters lists dead letters, oldest id first, payloads redacted.
func (i *Inspector) DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetterRow, error) {
	var missing []string
	rows, err := i.deadLetters(ctx, &missing, consumer.DeadLetterFilter{IDs: f.IDs, ConsumerGroup: f.ConsumerGroup, Topic: f.Topic,
		Status: f.Status, EventType: f.EventType, BusinessKey: f.BusinessKey, ErrorClass: consumer.Class(f.ErrorClass),
		Since: f.Since, Until: f.Until, Limit: f.Limit})
	if err != nil {
		return nil, err
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("inspect: table %s does not exist (run migrate)", missing[0])
	}
	return orEmpty(rows), nil
}

// DeadLetter returns one dead letter, or an error wrapping ErrNotFound.
func (i *Inspector) DeadLetter(ctx context.Context, id int64) (DeadLetterRow, error) {
	var missing []string
	rows, err := i.deadLetters(ctx, &missing, consumer.DeadLetterFilter{IDs: []int64{id}, Limit: 1})
	if err != nil {
		return DeadLetterRow{}, err
	}
	if len(rows) == 0 {
		return DeadLetterRow{}, fmt.Errorf("%w: dead letter %d", ErrNotFound, id)
	}
	return rows[0], nil
}

// txlogView renders the owner's row for humans: payload redacted, recovery
// fields only on recovered rows.
func (i *Inspector) txlogView(r txlog.Row) *TxlogRow {
	v := &TxlogRow{EventID: r.EventID, ProducerGroup: r.ProducerGroup, Topic: r.Topic, Tags: r.Tags, Keys: r.Keys,
		EventType: r.EventType, State: string(r.State), Payload: i.cfg.Redact(r.Payload), PayloadHash: r.PayloadHash,
		BusinessKey: r.BusinessKey, CreatedAt: r.CreatedAt, ResolvedAt: r.ResolvedAt, ResolvedBy: string(r.ResolvedBy),
		RawPayload: r.Payload}
	if !r.RecoveredAt.IsZero() {
		at, decision := r.RecoveredAt, string(r.RecoveryDecision)
		v.RecoveredAt, v.RecoveryDecision, v.RecoveryNote = &at, &decision, i.text(&r.RecoveryNote)
	}
	return v
}

// outboxView renders the owner's row for humans: payload and error redacted,
// unset columns nil.
func (i *Inspector) outboxView(r outbox.Row) *OutboxRow {
	str := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	ts := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		return &t
	}
	return &OutboxRow{EventID: r.EventID, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
		AggregateVersion: r.AggregateVersion, EventType: r.EventType, Destination: r.Destination, MessageKey: r.MessageKey,
		Payload: i.cfg.Redact(r.Payload), Status: string(r.Status), OwnerToken: str(r.OwnerToken), LeaseUntil: ts(r.LeaseUntil),
		RetryCount: r.RetryCount, NextRetryAt: r.NextRetryAt, LastErrorCode: str(r.LastErrorCode),
		LastErrorMessage: i.text(str(r.LastErrorMessage)), CreatedAt: r.CreatedAt, SentAt: ts(r.SentAt), UpdatedAt: r.UpdatedAt,
		RawPayload: r.Payload}
}
