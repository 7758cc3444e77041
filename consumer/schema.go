package consumer

import (
	"embed"
	"fmt"
	"io/fs"
	"time"

	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// DefaultPrefix is used when a Config or store is given no prefix (""):
// the one rmqtx default (internal/sqlname), shared by every package.
const DefaultPrefix = sqlname.DefaultPrefix

// DefaultTablePrefix is the old name of DefaultPrefix.
//
// Deprecated: use DefaultPrefix.
const DefaultTablePrefix = DefaultPrefix

//go:embed migrations
var migrationFS embed.FS

// Table name suffixes of the tables this package owns (<prefix><suffix>).
const (
	ConsumeLogTable       = "consume_log"
	AggregateVersionTable = "aggregate_version"
	AttemptTable          = "consume_attempt"
	DeadLetterTable       = "dead_letter"
	WindowTable           = "consume_window"
)

// tables holds the prefixed table names, built once from a validated prefix.
type tables struct {
	log, version, attempt, dead, window string
}

func newTables(prefix string) (tables, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := sqlname.ValidatePrefix(prefix); err != nil {
		return tables{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return tables{
		log:     prefix + ConsumeLogTable,
		version: prefix + AggregateVersionTable,
		attempt: prefix + AttemptTable,
		dead:    prefix + DeadLetterTable,
		window:  prefix + WindowTable,
	}, nil
}

// TableNames are the names of the consumer's tables under one prefix.
type TableNames struct {
	ConsumeLog       string // dedup log: one row per (group, event id) applied or stale
	AggregateVersion string // version guard
	Attempt          string // failed attempts of events not applied yet
	DeadLetter       string // parked messages
	Window           string // crash-count windows: per group and queue, the offsets a process may have run handlers on
}

// Tables returns the consumer's table names under prefix ("" means
// DefaultPrefix), or an error wrapping ErrConfig for an invalid prefix.
func Tables(prefix string) (TableNames, error) {
	t, err := newTables(prefix)
	if err != nil {
		return TableNames{}, err
	}
	return TableNames{ConsumeLog: t.log, AggregateVersion: t.version, Attempt: t.attempt, DeadLetter: t.dead, Window: t.window}, nil
}

// ConsumeLogRow is a consume-log (dedup) row as TableNames.ConsumeLogByEvent
// (from Tables(prefix)) reads it.
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
// AttemptsByEvent and AttemptsSince read it.
type AttemptRow struct {
	ConsumerGroup string    `db:"consumer_group" json:"consumer_group"`
	EventID       string    `db:"event_id" json:"event_id"`
	Attempts      int       `db:"attempts" json:"attempts"`
	LastClass     string    `db:"last_class" json:"last_class"`
	LastError     string    `db:"last_error" json:"last_error"`
	FirstFailedAt time.Time `db:"first_failed_at" json:"first_failed_at"`
	UpdatedAt     time.Time `db:"updated_at" json:"updated_at"`
}

// Migrations returns the package's schema steps for the dialect named d ("mysql"): the
// NNN_description.sql files of one folder, and the validated table names that fill their
// {{...}} placeholders under prefix ("" means the default prefix). schema.MigrateAll runs them.
//
// The steps create the consume log, the aggregate versions, the failed
// attempts and the dead letters (step 1), and the crash-count windows (step 2). A database migrated by an earlier release
// recorded them in <prefix>consumer_schema.
func Migrations(d string, prefix string) (fs.FS, map[string]string, error) {
	t, err := newTables(prefix)
	if err != nil {
		return nil, nil, err
	}
	fsys, err := fs.Sub(migrationFS, "migrations/"+d)
	if err == nil {
		_, err = fs.Stat(fsys, ".")
	}
	if d == "" || err != nil {
		return nil, nil, fmt.Errorf("%w: no migrations for dialect %q", ErrConfig, d)
	}
	return fsys, map[string]string{
		"{{" + ConsumeLogTable + "}}":       t.log,
		"{{" + AggregateVersionTable + "}}": t.version,
		"{{" + AttemptTable + "}}":          t.attempt,
		"{{" + DeadLetterTable + "}}":       t.dead,
		"{{" + WindowTable + "}}":           t.window,
	}, nil
}
