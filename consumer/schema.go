package consumer

import (
	"context"
	"embed"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// DefaultTablePrefix is used when a Config or store is given no prefix: the
// one rmqtx default (internal/sqlname), shared by every package.
const DefaultTablePrefix = sqlname.DefaultPrefix

//go:embed migrations/*.sql
var migrationFS embed.FS

// Table name suffixes of the tables this package owns (<prefix><suffix>).
const (
	ConsumeLogTable       = "consume_log"
	AggregateVersionTable = "aggregate_version"
	AttemptTable          = "consume_attempt"
	DeadLetterTable       = "dead_letter"
	schemaTable           = "consumer_schema"
)

// Columns of the consumer tables that other packages (inspect, archive)
// select or filter on. A column renamed here is renamed for all of them.
const (
	ColConsumerGroup   = "consumer_group"
	ColEventID         = "event_id"
	ColStatus          = "status"
	ColUpdatedAt       = "updated_at"
	ColFirstReceivedAt = "first_received_at" // consume log
	ColFirstFailedAt   = "first_failed_at"   // attempts
	ColFirstSeenAt     = "first_seen_at"     // dead letters
	ColLastSeenAt      = "last_seen_at"      // dead letters
	ColReplayedAt      = "replayed_at"       // dead letters
	ColResolvedAt      = "resolved_at"       // dead letters
	ColBusinessKey     = "business_key"      // dead letters
	ColID              = "id"                // dead letters
)

// tables holds the prefixed table names, built once from a validated prefix.
type tables struct {
	log, version, attempt, dead, schema string
}

func newTables(prefix string) (tables, error) {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	if err := sqlname.ValidatePrefix(prefix); err != nil {
		return tables{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return tables{
		log:     prefix + ConsumeLogTable,
		version: prefix + AggregateVersionTable,
		attempt: prefix + AttemptTable,
		dead:    prefix + DeadLetterTable,
		schema:  prefix + schemaTable,
	}, nil
}

// TableNames are the names of the consumer's tables under one prefix.
type TableNames struct {
	ConsumeLog       string // dedup log: one row per (group, event id) applied or stale
	AggregateVersion string // version guard
	Attempt          string // failed attempts of events not applied yet
	DeadLetter       string // parked messages
}

// Tables returns the consumer's table names under prefix ("" means
// DefaultTablePrefix), or an error wrapping ErrConfig for an invalid prefix.
func Tables(prefix string) (TableNames, error) {
	t, err := newTables(prefix)
	if err != nil {
		return TableNames{}, err
	}
	return TableNames{ConsumeLog: t.log, AggregateVersion: t.version, Attempt: t.attempt, DeadLetter: t.dead}, nil
}

// ConsumeLogRow is a consume-log (dedup) row as ConsumeLogByEventSQL reads it.
type ConsumeLogRow struct {
	ConsumerGroup   string    `db:"consumer_group" json:"consumer_group"`
	EventType       string    `db:"event_type" json:"event_type"`
	RequestHash     string    `db:"request_hash" json:"request_hash"`
	Status          string    `db:"status" json:"status"` // StatusApplied or StatusStale
	ResultRef       *string   `db:"result_ref" json:"result_ref,omitempty"`
	RetryCount      int       `db:"retry_count" json:"retry_count"`
	FirstReceivedAt time.Time `db:"first_received_at" json:"first_received_at"`
	UpdatedAt       time.Time `db:"updated_at" json:"updated_at"`
}

// AttemptRow is a failed-attempt row (an event not applied yet), as
// AttemptsByEventSQL and AttemptsSinceSQL read it.
type AttemptRow struct {
	ConsumerGroup string    `db:"consumer_group" json:"consumer_group"`
	EventID       string    `db:"event_id" json:"event_id"`
	Attempts      int       `db:"attempts" json:"attempts"`
	LastClass     string    `db:"last_class" json:"last_class"`
	LastError     string    `db:"last_error" json:"last_error"`
	FirstFailedAt time.Time `db:"first_failed_at" json:"first_failed_at"`
	UpdatedAt     time.Time `db:"updated_at" json:"updated_at"`
}

const (
	consumeLogColumns = "consumer_group, event_type, request_hash, status, result_ref, retry_count, first_received_at, updated_at"
	attemptColumns    = "consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at"
)

// ConsumeLogByEventSQL reads the ConsumeLogRows of one event id (bind the
// id), one per consumer group, in group order.
func (t TableNames) ConsumeLogByEventSQL() string {
	return "SELECT " + consumeLogColumns + " FROM " + t.ConsumeLog + " WHERE event_id = ? ORDER BY consumer_group"
}

// AttemptsByEventSQL reads the AttemptRows of one event id (bind the id), in
// group order.
func (t TableNames) AttemptsByEventSQL() string {
	return "SELECT " + attemptColumns + " FROM " + t.Attempt + " WHERE event_id = ? ORDER BY consumer_group"
}

// AttemptsSinceSQL reads AttemptRows whose first failure is at or before a
// cutoff, oldest first (bind the cutoff and a limit).
func (t TableNames) AttemptsSinceSQL() string {
	return "SELECT " + attemptColumns + " FROM " + t.Attempt + " WHERE first_failed_at <= ? ORDER BY first_failed_at, consumer_group, event_id LIMIT ?"
}

// Migrate creates or upgrades the consumer tables (consume log, aggregate
// versions, attempts, dead letters) under prefix ("" means
// DefaultTablePrefix). It is idempotent and safe to run from several
// processes at once; it works on MariaDB 10.11 and MySQL 8.
// schema.MigrateAll runs it together with every other rmqtx table.
func Migrate(ctx context.Context, db *sqlx.DB, prefix string) error {
	if prefix == "" {
		prefix = DefaultTablePrefix
	}
	t, err := newTables(prefix)
	if err != nil {
		return err
	}
	err = migrate.Run(ctx, db, migrate.Plan{
		FS: migrationFS, Dir: "migrations",
		Replace:     map[string]string{"{{prefix}}": prefix},
		SchemaTable: t.schema,
	})
	if err != nil {
		return fmt.Errorf("consumer: %w", err)
	}
	return nil
}
