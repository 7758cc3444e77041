package consumer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/envelope"
)

// Dead-letter statuses.
const (
	DeadLetterParked    = "PARKED"    // waiting for an operator
	DeadLetterReplayed  = "REPLAYED"  // re-published with its original event id
	DeadLetterDiscarded = "DISCARDED" // dropped on purpose by an operator
)

// DeadLetter is one parked message.
type DeadLetter struct {
	ID              int64
	ConsumerGroup   string
	Topic           string
	QueueID         int
	QueueOffset     int64
	MsgID           string
	EventID         string // "msgid:<id>" when the envelope had no usable id
	EventType       string
	BusinessKey     string
	ErrorClass      Class
	ErrorText       string // after RedactText
	Payload         []byte // after Redact
	PayloadRedacted bool   // Payload went through a Redact hook: it may differ from RequestHash
	RequestHash     string // hash of the delivered payload
	ExistingHash    string // conflicts: hash of the payload applied earlier
	Properties      map[string]string
	ReconsumeTimes  int
	ParkCount       int // how many times this message was parked
	Status          string
	FirstSeenAt     time.Time
	LastSeenAt      time.Time
	ReplayCount     int
	ReplayedAt      *time.Time
	ResolvedAt      *time.Time
	ResolutionNote  string
}

// Replayable reports whether the stored payload is the original one (its
// hash matches), so a replay re-publishes exactly what was delivered.
func (d DeadLetter) Replayable() bool {
	return !d.PayloadRedacted || envelope.Hash(d.Payload) == d.RequestHash
}

// DeadLetterFilter selects dead letters; zero fields do not filter.
type DeadLetterFilter struct {
	ConsumerGroup string
	Status        string
	EventType     string
	BusinessKey   string
	ErrorClass    Class
	AfterID       int64 // keyset pagination: rows with id > AfterID
	Limit         int   // default 100, at most 1000
}

// DeadLetterStore reads and resolves dead letters. The operations package
// and the runbook CLI use it; the Processor writes the rows.
type DeadLetterStore struct {
	db *sqlx.DB
	t  tables
}

// NewDeadLetterStore returns a store over the dead-letter table under prefix
// ("" means DefaultTablePrefix).
func NewDeadLetterStore(db *sqlx.DB, prefix string) (*DeadLetterStore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: nil DB", ErrConfig)
	}
	t, err := newTables(prefix)
	if err != nil {
		return nil, err
	}
	return &DeadLetterStore{db: db, t: t}, nil
}

const deadLetterColumns = "id, consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key," +
	" error_class, error_text, payload, payload_redacted, request_hash, existing_hash, properties, reconsume_times," +
	" park_count, status, first_seen_at, last_seen_at, replay_count, replayed_at, resolved_at, resolution_note"

type deadLetterRow struct {
	ID             int64          `db:"id"`
	ConsumerGroup  string         `db:"consumer_group"`
	Topic          string         `db:"topic"`
	QueueID        int            `db:"queue_id"`
	QueueOffset    int64          `db:"queue_offset"`
	MsgID          string         `db:"msg_id"`
	EventID        string         `db:"event_id"`
	EventType      string         `db:"event_type"`
	BusinessKey    string         `db:"business_key"`
	ErrorClass     string         `db:"error_class"`
	ErrorText      string         `db:"error_text"`
	Payload        []byte         `db:"payload"`
	PayloadRedact  bool           `db:"payload_redacted"`
	RequestHash    string         `db:"request_hash"`
	ExistingHash   sql.NullString `db:"existing_hash"`
	Properties     string         `db:"properties"`
	ReconsumeTimes int            `db:"reconsume_times"`
	ParkCount      int            `db:"park_count"`
	Status         string         `db:"status"`
	FirstSeenAt    mysql.NullTime `db:"first_seen_at"`
	LastSeenAt     mysql.NullTime `db:"last_seen_at"`
	ReplayCount    int            `db:"replay_count"`
	ReplayedAt     mysql.NullTime `db:"replayed_at"`
	ResolvedAt     mysql.NullTime `db:"resolved_at"`
	ResolutionNote sql.NullString `db:"resolution_note"`
}

func nullTime(t mysql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	u := t.Time.UTC()
	return &u
}

func (r deadLetterRow) deadLetter() DeadLetter {
	d := DeadLetter{
		ID: r.ID, ConsumerGroup: r.ConsumerGroup, Topic: r.Topic, QueueID: r.QueueID, QueueOffset: r.QueueOffset,
		MsgID: r.MsgID, EventID: r.EventID, EventType: r.EventType, BusinessKey: r.BusinessKey,
		ErrorClass: Class(r.ErrorClass), ErrorText: r.ErrorText, Payload: r.Payload, PayloadRedacted: r.PayloadRedact,
		RequestHash: r.RequestHash, ExistingHash: r.ExistingHash.String, ReconsumeTimes: r.ReconsumeTimes,
		ParkCount: r.ParkCount, Status: r.Status, ReplayCount: r.ReplayCount,
		ReplayedAt: nullTime(r.ReplayedAt), ResolvedAt: nullTime(r.ResolvedAt), ResolutionNote: r.ResolutionNote.String,
	}
	if t := nullTime(r.FirstSeenAt); t != nil {
		d.FirstSeenAt = *t
	}
	if t := nullTime(r.LastSeenAt); t != nil {
		d.LastSeenAt = *t
	}
	_ = json.Unmarshal([]byte(r.Properties), &d.Properties)
	return d
}

// List returns dead letters matching f, oldest id first.
func (s *DeadLetterStore) List(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	var where []string
	var args []any
	add := func(cond string, v any) { where = append(where, cond); args = append(args, v) }
	if f.ConsumerGroup != "" {
		add("consumer_group = ?", f.ConsumerGroup)
	}
	if f.Status != "" {
		add("status = ?", f.Status)
	}
	if f.EventType != "" {
		add("event_type = ?", f.EventType)
	}
	if f.BusinessKey != "" {
		add("business_key = ?", f.BusinessKey)
	}
	if f.ErrorClass != "" {
		add("error_class = ?", string(f.ErrorClass))
	}
	if f.AfterID > 0 {
		add("id > ?", f.AfterID)
	}
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, 1000)
	q := "SELECT " + deadLetterColumns + " FROM " + s.t.dead
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY id LIMIT ?"
	args = append(args, limit)
	var rows []deadLetterRow
	if err := s.db.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, fmt.Errorf("consumer: list dead letters: %w", err)
	}
	out := make([]DeadLetter, len(rows))
	for i, r := range rows {
		out[i] = r.deadLetter()
	}
	return out, nil
}

// Get returns one dead letter, or an error wrapping ErrNotFound.
func (s *DeadLetterStore) Get(ctx context.Context, id int64) (DeadLetter, error) {
	var r deadLetterRow
	err := s.db.GetContext(ctx, &r, "SELECT "+deadLetterColumns+" FROM "+s.t.dead+" WHERE id = ?", id)
	if errors.Is(err, sql.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("%w: dead letter %d", ErrNotFound, id)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("consumer: get dead letter %d: %w", id, err)
	}
	return r.deadLetter(), nil
}

// MarkReplayed moves a PARKED dead letter to REPLAYED (replay_count + 1,
// replayed_at now) after it was re-published with its original event id. If
// the replay fails again, the processor parks it again (status PARKED).
func (s *DeadLetterStore) MarkReplayed(ctx context.Context, id int64, note string) error {
	return s.resolve(ctx, id, "status = '"+DeadLetterReplayed+"', replay_count = replay_count + 1, replayed_at = UTC_TIMESTAMP(6)", note)
}

// MarkDiscarded moves a PARKED dead letter to DISCARDED. Later deliveries of
// the same message still update its last_seen_at but keep it DISCARDED.
func (s *DeadLetterStore) MarkDiscarded(ctx context.Context, id int64, note string) error {
	return s.resolve(ctx, id, "status = '"+DeadLetterDiscarded+"'", note)
}

func (s *DeadLetterStore) resolve(ctx context.Context, id int64, set, note string) error {
	res, err := s.db.ExecContext(ctx, "UPDATE "+s.t.dead+" SET "+set+", resolved_at = UTC_TIMESTAMP(6), resolution_note = ?"+
		" WHERE id = ? AND status = '"+DeadLetterParked+"'", clip(note, 512), id)
	if err != nil {
		return fmt.Errorf("consumer: resolve dead letter %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	if _, err := s.Get(ctx, id); err != nil {
		return err
	}
	return fmt.Errorf("%w: dead letter %d", ErrNotParked, id)
}

// Count returns the number of dead letters of group (all groups when empty)
// in status (all when empty).
func (s *DeadLetterStore) Count(ctx context.Context, group, status string) (int, error) {
	q := "SELECT COUNT(*) FROM " + s.t.dead + " WHERE (? = '' OR consumer_group = ?) AND (? = '' OR status = ?)"
	var n int
	if err := s.db.GetContext(ctx, &n, q, group, group, status, status); err != nil {
		return 0, fmt.Errorf("consumer: count dead letters: %w", err)
	}
	return n, nil
}
