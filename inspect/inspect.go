package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// DefaultTablePrefix is the prefix of every rmqtx table unless configured.
const DefaultTablePrefix = "rmqtx_"

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
	// TablePrefix of all rmqtx tables. Default DefaultTablePrefix.
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
type Inspector struct {
	cfg  Config
	t    struct{ txlog, outbox, consume, attempt, dead, audit, item string }
	dead *consumer.DeadLetterStore // builds every dead-letter read
}

// New validates cfg and returns an Inspector.
func New(cfg Config) (*Inspector, error) {
	if cfg.DB == nil {
		return nil, fmt.Errorf("%w: DB is required", ErrConfig)
	}
	if cfg.TablePrefix == "" {
		cfg.TablePrefix = DefaultTablePrefix
	}
	if err := sqlname.ValidatePrefix(cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
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
	i := &Inspector{cfg: cfg, dead: dead}
	p := cfg.TablePrefix
	i.t.txlog, i.t.outbox, i.t.consume, i.t.attempt = p+"txlog", p+"outbox", p+"consume_log", p+"consume_attempt"
	i.t.dead, i.t.audit, i.t.item = p+"dead_letter", p+"replay_audit", p+"replay_audit_item"
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

// ConsumeRow is a consume-log (dedup) row.
type ConsumeRow struct {
	ConsumerGroup   string    `db:"consumer_group" json:"consumer_group"`
	EventType       string    `db:"event_type" json:"event_type"`
	RequestHash     string    `db:"request_hash" json:"request_hash"`
	Status          string    `db:"status" json:"status"`
	ResultRef       *string   `db:"result_ref" json:"result_ref,omitempty"`
	RetryCount      int       `db:"retry_count" json:"retry_count"`
	FirstReceivedAt time.Time `db:"first_received_at" json:"first_received_at"`
	UpdatedAt       time.Time `db:"updated_at" json:"updated_at"`
}

// AttemptRow is a failed-attempt row of an event not applied yet.
type AttemptRow struct {
	ConsumerGroup string    `db:"consumer_group" json:"consumer_group"`
	EventID       string    `db:"event_id" json:"event_id"`
	Attempts      int       `db:"attempts" json:"attempts"`
	LastClass     string    `db:"last_class" json:"last_class"`
	LastError     string    `db:"last_error" json:"last_error"`
	FirstFailedAt time.Time `db:"first_failed_at" json:"first_failed_at"`
	UpdatedAt     time.Time `db:"updated_at" json:"updated_at"`
}

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

// ReplayRow is one replay of the event (replay_audit_item joined with its run).
type ReplayRow struct {
	AuditID      int64     `db:"audit_id" json:"audit_id"`
	DeadLetterID int64     `db:"dead_letter_id" json:"dead_letter_id"`
	Result       string    `db:"result" json:"result"`
	Detail       string    `db:"detail" json:"detail,omitempty"`
	MsgID        string    `db:"msg_id" json:"msg_id,omitempty"`
	At           time.Time `db:"at" json:"at"`
	Operator     string    `db:"operator" json:"operator"`
	Reason       string    `db:"reason" json:"reason"`
}

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

func isMissingTable(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == 1146
}

// query runs one read, recording a missing table instead of failing.
func (i *Inspector) query(ctx context.Context, missing *[]string, table string, dest any, q string, args ...any) error {
	err := i.cfg.DB.SelectContext(ctx, dest, q, args...)
	if isMissingTable(err) {
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
	var tx []TxlogRow
	if err := i.query(ctx, &v.Missing, i.t.txlog, &tx, "SELECT event_id, producer_group, topic, tags, msg_keys, event_type, state, payload,"+
		" payload_hash, business_key, created_at, resolved_at, resolved_by, recovered_at, recovery_decision, recovery_note FROM "+
		i.t.txlog+" WHERE event_id = ?", id); err != nil {
		return v, err
	}
	if len(tx) > 0 {
		r := tx[0]
		r.Payload = i.cfg.Redact(r.RawPayload)
		r.RecoveryNote = i.text(r.RecoveryNote)
		v.Txlog = &r
	}
	var ob []OutboxRow
	if err := i.query(ctx, &v.Missing, i.t.outbox, &ob, "SELECT event_id, aggregate_type, aggregate_id, aggregate_version, event_type,"+
		" destination, message_key, payload, status, owner_token, lease_until, retry_count, next_retry_at, last_error_code,"+
		" last_error_message, created_at, sent_at, updated_at FROM "+i.t.outbox+" WHERE event_id = ?", id); err != nil {
		return v, err
	}
	if len(ob) > 0 {
		r := ob[0]
		r.Payload = i.cfg.Redact(r.RawPayload)
		r.LastErrorMessage = i.text(r.LastErrorMessage)
		v.Outbox = &r
	}
	if err := i.query(ctx, &v.Missing, i.t.consume, &v.Consumed, "SELECT consumer_group, event_type, request_hash, status, result_ref,"+
		" retry_count, first_received_at, updated_at FROM "+i.t.consume+" WHERE event_id = ? ORDER BY consumer_group", id); err != nil {
		return v, err
	}
	if err := i.query(ctx, &v.Missing, i.t.attempt, &v.Attempts, "SELECT consumer_group, event_id, attempts, last_class, last_error,"+
		" first_failed_at, updated_at FROM "+i.t.attempt+" WHERE event_id = ? ORDER BY consumer_group", id); err != nil {
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
	if err := i.query(ctx, &v.Missing, i.t.item, &v.Replays, "SELECT it.audit_id, it.dead_letter_id, it.result, it.detail, it.msg_id, it.at,"+
		" a.operator, a.reason FROM "+i.t.item+" it JOIN "+i.t.audit+" a ON a.id = it.audit_id WHERE it.event_id = ? ORDER BY it.audit_id, it.dead_letter_id", id); err != nil {
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
	var rows []DeadLetterRow
	q, args := i.dead.SelectSQL("", f)
	if err := i.query(ctx, missing, i.t.dead, &rows, q, args...); err != nil {
		return nil, err
	}
	for k := range rows {
		r := &rows[k]
		r.Payload = i.cfg.Redact(r.RawPayload)
		r.ErrorText = i.cfg.RedactText(r.ErrorText)
		r.ResolutionNote = i.text(r.ResolutionNote)
		if r.RawProperties != "" {
			_ = json.Unmarshal([]byte(r.RawProperties), &r.Properties)
		}
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
	for _, q := range []struct{ table, sql string }{
		{i.t.txlog, "SELECT event_id FROM " + i.t.txlog + " WHERE business_key = ? LIMIT ?"},
		{i.t.outbox, "SELECT event_id FROM " + i.t.outbox + " WHERE message_key = ? LIMIT ?"},
		{i.t.dead, "SELECT DISTINCT event_id FROM " + i.t.dead + " WHERE business_key = ? LIMIT ?"},
	} {
		var got []string
		if err := i.query(ctx, &missing, q.table, &got, q.sql, key, limit); err != nil {
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
