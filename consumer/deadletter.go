package consumer

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqltime"
	"github.com/rmqtx/rmqtx/wire"
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
	Payload         []byte // after ProcessorConfig.Redact: nil by default, as delivered with KeepPayload
	PayloadRedacted bool   // Redact changed or dropped the payload: Payload is not what was delivered
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
	return !d.PayloadRedacted || wire.Hash(d.Payload) == d.RequestHash
}

// DeadLetterFilter selects dead letters; zero fields do not filter and every
// set field must match. It is the one definition of a dead-letter selection:
// List, CountFilter and SelectSQL (which the replay and inspect packages
// build their reads on) all apply it the same way.
type DeadLetterFilter struct {
	IDs           []int64 // id is one of these
	ConsumerGroup string
	Topic         string // original topic
	EventID       string
	Status        string
	Statuses      []string // status is one of these
	EventType     string
	BusinessKey   string
	ErrorClass    Class
	// Since and Until bound first_seen_at (when first parked) to
	// [Since, Until); NotAfter bounds it inclusively (first_seen_at <=
	// NotAfter: parked at least this long ago).
	Since, Until, NotAfter time.Time
	// LastSeenSince keeps dead letters parked, first or again, at or after it
	// (last_seen_at >= LastSeenSince).
	LastSeenSince time.Time
	AfterID       int64 // keyset pagination: rows with id > AfterID
	// Limit caps the rows read, oldest id first: default DefaultDeadLetterLimit
	// (100); List caps it at MaxDeadLetterLimit (1000), SelectSQL does not.
	// CountFilter ignores it.
	Limit int
}

// Dead-letter read limits (see DeadLetterFilter.Limit).
const (
	DefaultDeadLetterLimit = 100
	MaxDeadLetterLimit     = 1000
)

// where returns the condition f selects (" WHERE ...", or "" when f
// selects every row) and its arguments. Times are bound in UTC.
func (f DeadLetterFilter) where() (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, v ...any) { conds = append(conds, cond); args = append(args, v...) }
	if len(f.IDs) > 0 {
		cond, v := inList("id", f.IDs)
		add(cond, v...)
	}
	for _, c := range []struct{ col, v string }{
		{"consumer_group", f.ConsumerGroup}, {"topic", f.Topic}, {"event_id", f.EventID}, {"status", f.Status},
		{"event_type", f.EventType}, {"business_key", f.BusinessKey}, {"error_class", string(f.ErrorClass)},
	} {
		if c.v != "" {
			add(c.col+" = ?", c.v)
		}
	}
	if len(f.Statuses) > 0 {
		cond, v := inList("status", f.Statuses)
		add(cond, v...)
	}
	for _, c := range []struct {
		cond string
		t    time.Time
	}{
		{"first_seen_at >= ?", f.Since}, {"first_seen_at < ?", f.Until}, {"first_seen_at <= ?", f.NotAfter},
		{"last_seen_at >= ?", f.LastSeenSince},
	} {
		if !c.t.IsZero() {
			add(c.cond, c.t.UTC())
		}
	}
	if f.AfterID > 0 {
		add("id > ?", f.AfterID)
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// inList returns "col IN (?, ?, ...)" and vs as arguments.
func inList[T any](col string, vs []T) (string, []any) {
	args := make([]any, len(vs))
	for i, v := range vs {
		args[i] = v
	}
	return col + " IN (" + strings.TrimSuffix(strings.Repeat("?, ", len(vs)), ", ") + ")", args
}

// DeadLetterStore reads and resolves dead letters. It owns every read of the
// dead-letter table: the replay and inspect packages and the runbook CLI go
// through it (SelectSQL for reads of their own columns); the Processor writes
// the rows.
type DeadLetterStore struct {
	db *sqlx.DB
	t  tables
	d  dialect.Dialect
}

// NewDeadLetterStore returns a store over the dead-letter table under prefix
// ("" means DefaultPrefix). A database whose driver rmqtx does not
// support is an error wrapping ErrConfig.
func NewDeadLetterStore(db *sqlx.DB, prefix string) (*DeadLetterStore, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: DB is required", ErrConfig)
	}
	d, err := dialect.For(db)
	if err != nil {
		return nil, fmt.Errorf("%w: DB: %w", ErrConfig, err)
	}
	t, err := newTables(prefix)
	if err != nil {
		return nil, err
	}
	return &DeadLetterStore{db: db, t: t, d: d}, nil
}

const deadLetterColumns = "id, consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key," +
	" error_class, error_text, payload, payload_redacted, request_hash, existing_hash, properties, reconsume_times," +
	" park_count, status, first_seen_at, last_seen_at, replay_count, replayed_at, resolved_at, resolution_note"

type deadLetterRow struct {
	ID             int64            `db:"id"`
	ConsumerGroup  string           `db:"consumer_group"`
	Topic          string           `db:"topic"`
	QueueID        int              `db:"queue_id"`
	QueueOffset    int64            `db:"queue_offset"`
	MsgID          string           `db:"msg_id"`
	EventID        string           `db:"event_id"`
	EventType      string           `db:"event_type"`
	BusinessKey    string           `db:"business_key"`
	ErrorClass     string           `db:"error_class"`
	ErrorText      string           `db:"error_text"`
	Payload        []byte           `db:"payload"`
	PayloadRedact  bool             `db:"payload_redacted"`
	RequestHash    string           `db:"request_hash"`
	ExistingHash   sql.NullString   `db:"existing_hash"`
	Properties     string           `db:"properties"`
	ReconsumeTimes int              `db:"reconsume_times"`
	ParkCount      int              `db:"park_count"`
	Status         string           `db:"status"`
	FirstSeenAt    sqltime.NullTime `db:"first_seen_at"`
	LastSeenAt     sqltime.NullTime `db:"last_seen_at"`
	ReplayCount    int              `db:"replay_count"`
	ReplayedAt     sqltime.NullTime `db:"replayed_at"`
	ResolvedAt     sqltime.NullTime `db:"resolved_at"`
	ResolutionNote sql.NullString   `db:"resolution_note"`
}

func (r deadLetterRow) deadLetter() DeadLetter {
	d := DeadLetter{
		ID: r.ID, ConsumerGroup: r.ConsumerGroup, Topic: r.Topic, QueueID: r.QueueID, QueueOffset: r.QueueOffset,
		MsgID: r.MsgID, EventID: r.EventID, EventType: r.EventType, BusinessKey: r.BusinessKey,
		ErrorClass: Class(r.ErrorClass), ErrorText: r.ErrorText, Payload: r.Payload, PayloadRedacted: r.PayloadRedact,
		RequestHash: r.RequestHash, ExistingHash: r.ExistingHash.String, ReconsumeTimes: r.ReconsumeTimes,
		ParkCount: r.ParkCount, Status: r.Status, ReplayCount: r.ReplayCount,
		ReplayedAt: r.ReplayedAt.Ptr(), ResolvedAt: r.ResolvedAt.Ptr(), ResolutionNote: r.ResolutionNote.String,
	}
	d.FirstSeenAt, d.LastSeenAt = r.FirstSeenAt.Time, r.LastSeenAt.Time
	_ = json.Unmarshal([]byte(r.Properties), &d.Properties)
	return d
}

// SelectSQL returns the query that reads the dead letters f selects, oldest
// id first, and its arguments: "SELECT <columns> FROM <dead-letter table>
// [WHERE ...] ORDER BY id LIMIT ?", with the database's placeholders. columns is a select list over the table
// ("" selects every column, in the order and with the names DeadLetter is
// read from); the limit is f.Limit, default DefaultDeadLetterLimit, not capped.
// The replay and inspect packages read dead letters with it.
func (s *DeadLetterStore) SelectSQL(columns string, f DeadLetterFilter) (string, []any) {
	if columns == "" {
		columns = deadLetterColumns
	}
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultDeadLetterLimit
	}
	where, args := f.where()
	return s.d.Rebind("SELECT " + columns + " FROM " + s.t.dead + where + " ORDER BY id LIMIT ?"), append(args, limit)
}

// List returns dead letters matching f, oldest id first.
func (s *DeadLetterStore) List(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error) {
	if f.Limit <= 0 {
		f.Limit = DefaultDeadLetterLimit
	}
	f.Limit = min(f.Limit, MaxDeadLetterLimit)
	q, args := s.SelectSQL("", f)
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
	return s.get(ctx, s.db, id, "")
}

// GetForUpdate reads one dead letter inside tx and locks its row until tx
// ends (SELECT ... FOR UPDATE), or returns an error wrapping ErrNotFound.
// With MarkReplayedTx it lets a replayer send a dead letter and record it in
// one transaction, so that concurrent replays never send it twice.
func (s *DeadLetterStore) GetForUpdate(ctx context.Context, tx *sqlx.Tx, id int64) (DeadLetter, error) {
	return s.get(ctx, tx, id, " FOR UPDATE")
}

func (s *DeadLetterStore) get(ctx context.Context, q sqlx.QueryerContext, id int64, suffix string) (DeadLetter, error) {
	var r deadLetterRow
	err := sqlx.GetContext(ctx, q, &r, s.d.Rebind("SELECT "+deadLetterColumns+" FROM "+s.t.dead+" WHERE id = ?"+suffix), id)
	if errors.Is(err, sql.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("%w: dead letter %d", ErrNotFound, id)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("consumer: get dead letter %d: %w", id, err)
	}
	return r.deadLetter(), nil
}

// markReplayed is the change of a replayed dead letter.
func (s *DeadLetterStore) markReplayed() string {
	return "status = '" + DeadLetterReplayed + "', replay_count = replay_count + 1, replayed_at = " + s.d.Now()
}

// MarkReplayed moves a PARKED dead letter to REPLAYED (replay_count + 1,
// replayed_at now) after it was re-published with its original event id. If
// the replay fails again, the processor parks it again (status PARKED).
func (s *DeadLetterStore) MarkReplayed(ctx context.Context, id int64, note string) error {
	return s.resolve(ctx, s.db, id, s.markReplayed(), note, DeadLetterParked)
}

// MarkReplayedTx is MarkReplayed inside tx, for a dead letter the caller
// locked with GetForUpdate and re-published. It also accepts a REPLAYED dead
// letter (one sent again); any other status is an error wrapping
// ErrNotParked.
func (s *DeadLetterStore) MarkReplayedTx(ctx context.Context, tx *sqlx.Tx, id int64, note string) error {
	return s.resolve(ctx, tx, id, s.markReplayed(), note, DeadLetterParked, DeadLetterReplayed)
}

// MarkDiscarded moves a PARKED dead letter to DISCARDED. Later deliveries of
// the same message still update its last_seen_at but keep it DISCARDED.
func (s *DeadLetterStore) MarkDiscarded(ctx context.Context, id int64, note string) error {
	return s.resolve(ctx, s.db, id, "status = '"+DeadLetterDiscarded+"'", note, DeadLetterParked)
}

// resolve applies set to dead letter id if its status is one of from.
func (s *DeadLetterStore) resolve(ctx context.Context, e sqlx.ExtContext, id int64, set, note string, from ...string) error {
	res, err := e.ExecContext(ctx, s.d.Rebind("UPDATE "+s.t.dead+" SET "+set+", resolved_at = "+s.d.Now()+", resolution_note = ?"+
		" WHERE id = ? AND status IN ('"+strings.Join(from, "', '")+"')"), clip(note, 512), id)
	if err != nil {
		return fmt.Errorf("consumer: resolve dead letter %d: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	if _, err := s.get(ctx, e, id, ""); err != nil {
		return err
	}
	return fmt.Errorf("%w: dead letter %d", ErrNotParked, id)
}

// Count returns the number of dead letters of group (all groups when empty)
// in status (all when empty).
func (s *DeadLetterStore) Count(ctx context.Context, group, status string) (int, error) {
	return s.CountFilter(ctx, DeadLetterFilter{ConsumerGroup: group, Status: status})
}

// CountFilter returns the number of dead letters f selects (f.Limit is
// ignored).
func (s *DeadLetterStore) CountFilter(ctx context.Context, f DeadLetterFilter) (int, error) {
	where, args := f.where()
	var n int
	if err := s.db.GetContext(ctx, &n, s.d.Rebind("SELECT COUNT(*) FROM "+s.t.dead+where), args...); err != nil {
		return 0, fmt.Errorf("consumer: count dead letters: %w", err)
	}
	return n, nil
}
