package archive

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/rmqlog"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
)

// DefaultTablePrefix is the prefix of every rmqtx table unless configured:
// the one rmqtx default (internal/sqlname).
const DefaultTablePrefix = sqlname.DefaultPrefix

// Default retentions (see the package documentation for why they are safe).
const (
	DefaultTxlogRetention      = 7 * 24 * time.Hour
	DefaultOutboxRetention     = 7 * 24 * time.Hour
	DefaultOutboxDeadRetention = 30 * 24 * time.Hour
	DefaultConsumeLogRetention = 30 * 24 * time.Hour
	DefaultDeadLetterRetention = 30 * 24 * time.Hour
)

// Minimum retentions, refused below unless AllowShortRetention.
const (
	MinTxlogRetention      = txlog.MinRetention
	MinOutboxRetention     = time.Hour
	MinOutboxDeadRetention = 24 * time.Hour
	MinConsumeLogRetention = 72 * time.Hour
	MinDeadLetterRetention = 24 * time.Hour
)

// Table names one archivable table (without prefix).
type Table string

// The archivable tables, named by their owners.
const (
	Txlog      Table = txlog.TableSuffix
	Outbox     Table = outbox.TableSuffix
	ConsumeLog Table = consumer.ConsumeLogTable
	DeadLetter Table = consumer.DeadLetterTable
)

// AllTables is the default Tables, in the order they are processed.
var AllTables = []Table{Txlog, Outbox, ConsumeLog, DeadLetter}

// Sentinel errors.
var (
	ErrConfig = errors.New("archive: invalid config")
	// ErrRetentionTooShort is a config error too: errors.Is(err, ErrConfig)
	// holds for it, without a second package prefix in its text.
	ErrRetentionTooShort error = retentionTooShort{}
)

type retentionTooShort struct{}

func (retentionTooShort) Error() string        { return "archive: retention shorter than the safe minimum" }
func (retentionTooShort) Is(target error) bool { return target == ErrConfig }

// Config configures an Archiver.
type Config struct {
	// DB holds the tables. Required.
	DB *sqlx.DB
	// TablePrefix of all rmqtx tables. Default DefaultTablePrefix.
	TablePrefix string
	// Tables to process. Default AllTables. A table that does not exist is
	// reported as missing and skipped (a service may use only some parts).
	Tables []Table
	// Retentions; zero means the default of the same name.
	TxlogRetention      time.Duration
	OutboxRetention     time.Duration // SENT rows
	OutboxDeadRetention time.Duration // DEAD rows
	ConsumeLogRetention time.Duration
	DeadLetterRetention time.Duration
	// AllowShortRetention lifts the minimum retentions and the
	// ConsumeLogRetention >= DeadLetterRetention rule. Tests only.
	AllowShortRetention bool
	// Batch is the number of rows per delete transaction. Default 500.
	Batch int
	// MaxBatches bounds one Run per table (0: until nothing is left).
	MaxBatches int
	// Move copies rows to <table>_archive (created LIKE the table when
	// missing) in the same transaction as the delete, instead of only
	// deleting them. A row archived twice (same key) is replaced.
	Move bool
	// Now returns the current time; cutoffs are Now() - retention. Default
	// time.Now. Timestamps in the tables are UTC.
	Now func() time.Time
	// Logger receives one line per table. Default quiet.
	Logger logrus.FieldLogger
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultTablePrefix
	}
	if len(c.Tables) == 0 {
		c.Tables = AllTables
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.TxlogRetention, DefaultTxlogRetention)
	def(&c.OutboxRetention, DefaultOutboxRetention)
	def(&c.OutboxDeadRetention, DefaultOutboxDeadRetention)
	def(&c.ConsumeLogRetention, DefaultConsumeLogRetention)
	def(&c.DeadLetterRetention, DefaultDeadLetterRetention)
	if c.Batch == 0 {
		c.Batch = 500
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Logger = rmqlog.OrQuiet(c.Logger)
	return c
}

func (c Config) validate() error {
	if c.DB == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	if err := sqlname.ValidatePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("%w: TablePrefix: %w", ErrConfig, err)
	}
	if c.Batch < 0 {
		return fmt.Errorf("%w: Batch must not be negative", ErrConfig)
	}
	if c.MaxBatches < 0 {
		return fmt.Errorf("%w: MaxBatches must not be negative", ErrConfig)
	}
	for _, t := range c.Tables {
		if _, ok := specs[t]; !ok {
			return fmt.Errorf("%w: Tables: unknown table %q", ErrConfig, t)
		}
	}
	if c.AllowShortRetention {
		return nil
	}
	for _, r := range []struct {
		name     string
		got, min time.Duration
	}{
		{"TxlogRetention", c.TxlogRetention, MinTxlogRetention},
		{"OutboxRetention", c.OutboxRetention, MinOutboxRetention},
		{"OutboxDeadRetention", c.OutboxDeadRetention, MinOutboxDeadRetention},
		{"ConsumeLogRetention", c.ConsumeLogRetention, MinConsumeLogRetention},
		{"DeadLetterRetention", c.DeadLetterRetention, MinDeadLetterRetention},
	} {
		if r.got < r.min {
			return fmt.Errorf("%w: %s %s < %s", ErrRetentionTooShort, r.name, r.got, r.min)
		}
	}
	if c.ConsumeLogRetention < c.DeadLetterRetention {
		return fmt.Errorf("%w: ConsumeLogRetention %s < DeadLetterRetention %s: a dead letter replayed late would miss its dedup row",
			ErrRetentionTooShort, c.ConsumeLogRetention, c.DeadLetterRetention)
	}
	return nil
}

// rule is one "terminal and old" predicate on a table.
type rule struct {
	name      string // for reports: "SENT", "DEAD", ...
	where     string // with one ? for the cutoff per occurrence (cutoffArgs)
	cutoffs   int    // how many times the cutoff is bound
	orderBy   string
	retention func(Config) time.Duration
}

type spec struct {
	pk    []string
	rules []rule
}

// specs say which rows are terminal, in the owners' column names and states
// (the in-flight states, never listed here, are never removed: I9).
var specs = map[Table]spec{
	Txlog: {pk: []string{txlog.ColEventID}, rules: []rule{{
		name:  string(txlog.StateCommitted) + "/" + string(txlog.StateRolledBack),
		where: in(txlog.ColState, string(txlog.StateCommitted), string(txlog.StateRolledBack)) + " AND " + txlog.ColResolvedAt + " < ?", cutoffs: 1,
		orderBy: txlog.ColResolvedAt, retention: func(c Config) time.Duration { return c.TxlogRetention }}}},
	Outbox: {pk: []string{outbox.ColEventID}, rules: []rule{
		{name: string(outbox.StatusSent), where: in(outbox.ColStatus, string(outbox.StatusSent)) + " AND " + outbox.ColUpdatedAt + " < ?", cutoffs: 1,
			orderBy: outbox.ColUpdatedAt, retention: func(c Config) time.Duration { return c.OutboxRetention }},
		{name: string(outbox.StatusDead), where: in(outbox.ColStatus, string(outbox.StatusDead)) + " AND " + outbox.ColUpdatedAt + " < ?", cutoffs: 1,
			orderBy: outbox.ColUpdatedAt, retention: func(c Config) time.Duration { return c.OutboxDeadRetention }},
	}},
	ConsumeLog: {pk: []string{consumer.ColConsumerGroup, consumer.ColEventID}, rules: []rule{{
		name:  consumer.StatusApplied + "/" + consumer.StatusStale,
		where: in(consumer.ColStatus, consumer.StatusApplied, consumer.StatusStale) + " AND " + consumer.ColUpdatedAt + " < ?", cutoffs: 1,
		orderBy: consumer.ColUpdatedAt, retention: func(c Config) time.Duration { return c.ConsumeLogRetention }}}},
	DeadLetter: {pk: []string{consumer.ColID}, rules: []rule{{
		name: consumer.DeadLetterReplayed + "/" + consumer.DeadLetterDiscarded,
		where: in(consumer.ColStatus, consumer.DeadLetterReplayed, consumer.DeadLetterDiscarded) +
			" AND COALESCE(" + consumer.ColResolvedAt + ", " + consumer.ColReplayedAt + ", " + consumer.ColLastSeenAt + ") < ? AND " +
			consumer.ColLastSeenAt + " < ?",
		cutoffs: 2, orderBy: consumer.ColID,
		retention: func(c Config) time.Duration { return c.DeadLetterRetention }}}},
}

// in renders "col IN ('A', 'B')" for the owners' state constants (never
// user input: values from outside are always bound).
func in(col string, states ...string) string {
	return col + " IN ('" + strings.Join(states, "', '") + "')"
}

// RuleReport is what happened (or would happen) under one rule.
type RuleReport struct {
	Table     string        `json:"table"`
	Rule      string        `json:"rule"`
	Retention time.Duration `json:"retention_ns"`
	Cutoff    time.Time     `json:"cutoff"`
	Eligible  int64         `json:"eligible"` // rows matching when the rule started
	Removed   int64         `json:"removed"`  // rows deleted (0 in a dry run)
	Moved     int64         `json:"moved"`    // rows copied to the archive table
	Batches   int           `json:"batches"`
	Missing   bool          `json:"missing,omitempty"` // the table does not exist
}

// Report is the outcome of Plan or Run.
type Report struct {
	DryRun bool         `json:"dry_run"`
	Move   bool         `json:"move"`
	Rules  []RuleReport `json:"rules"`
}

// Removed is the total of removed rows.
func (r Report) Removed() int64 {
	var n int64
	for _, x := range r.Rules {
		n += x.Removed
	}
	return n
}

// Archiver removes terminal rows past retention.
type Archiver struct {
	cfg Config
}

// New validates cfg (after WithDefaults).
func New(cfg Config) (*Archiver, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Archiver{cfg: cfg}, nil
}

// Config returns the configuration with defaults applied.
func (a *Archiver) Config() Config { return a.cfg }

// Plan counts what Run would remove now (a dry run). It writes nothing.
func (a *Archiver) Plan(ctx context.Context) (Report, error) { return a.do(ctx, true) }

// Run removes (or moves) the eligible rows, batch by batch. It returns the
// report as far as it got, also on error.
func (a *Archiver) Run(ctx context.Context) (Report, error) { return a.do(ctx, false) }

func (a *Archiver) do(ctx context.Context, dry bool) (Report, error) {
	rep := Report{DryRun: dry, Move: a.cfg.Move}
	now := a.cfg.Now().UTC()
	for _, t := range a.cfg.Tables {
		sp := specs[t]
		name := a.cfg.TablePrefix + string(t)
		exists, err := a.tableExists(ctx, name)
		if err != nil {
			return rep, err
		}
		for _, ru := range sp.rules {
			ret := ru.retention(a.cfg)
			rr := RuleReport{Table: name, Rule: ru.name, Retention: ret, Cutoff: now.Add(-ret), Missing: !exists}
			if !exists {
				rep.Rules = append(rep.Rules, rr)
				continue
			}
			if err := a.cfg.DB.GetContext(ctx, &rr.Eligible, "SELECT COUNT(*) FROM "+name+" WHERE "+ru.where, cutoffArgs(ru, rr.Cutoff)...); err != nil {
				rep.Rules = append(rep.Rules, rr)
				return rep, fmt.Errorf("archive: count %s: %w", name, err)
			}
			if !dry && rr.Eligible > 0 {
				err = a.runRule(ctx, name, sp, ru, &rr)
			}
			rep.Rules = append(rep.Rules, rr)
			a.cfg.Logger.WithFields(logrus.Fields{"table": name, "rule": ru.name, "eligible": rr.Eligible, "removed": rr.Removed, "dry_run": dry}).
				Info("archive: table processed")
			if err != nil {
				return rep, err
			}
		}
	}
	return rep, nil
}

func cutoffArgs(ru rule, cutoff time.Time) []any {
	args := make([]any, ru.cutoffs)
	for i := range args {
		args[i] = cutoff
	}
	return args
}

func (a *Archiver) tableExists(ctx context.Context, name string) (bool, error) {
	var n int
	err := a.cfg.DB.GetContext(ctx, &n, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", name)
	if err != nil {
		return false, fmt.Errorf("archive: look up table %s: %w", name, err)
	}
	return n > 0, nil
}

func (a *Archiver) runRule(ctx context.Context, name string, sp spec, ru rule, rr *RuleReport) error {
	archive := name + "_archive"
	if a.cfg.Move {
		if _, err := a.cfg.DB.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+archive+" LIKE "+name); err != nil {
			return fmt.Errorf("archive: create %s: %w", archive, err)
		}
	}
	pkCols := strings.Join(sp.pk, ", ")
	selectPK := "SELECT " + pkCols + " FROM " + name + " WHERE " + ru.where + " ORDER BY " + ru.orderBy + " LIMIT ?"
	for a.cfg.MaxBatches == 0 || rr.Batches < a.cfg.MaxBatches {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("archive: %s: %w", name, err)
		}
		rows, err := a.cfg.DB.QueryxContext(ctx, selectPK, append(cutoffArgs(ru, rr.Cutoff), a.cfg.Batch)...)
		if err != nil {
			return fmt.Errorf("archive: select %s: %w", name, err)
		}
		keys, err := scanKeys(rows)
		if err != nil {
			return fmt.Errorf("archive: select %s: %w", name, err)
		}
		if len(keys) == 0 {
			return nil
		}
		moved, removed, err := a.batch(ctx, name, archive, sp, ru, rr.Cutoff, keys)
		rr.Batches++
		rr.Moved += moved
		rr.Removed += removed
		if err != nil {
			return err
		}
		if len(keys) < a.cfg.Batch {
			return nil
		}
	}
	return nil
}

// batch locks the keyed rows that STILL match the rule, copies them when
// moving, and deletes exactly them, in one transaction.
func (a *Archiver) batch(ctx context.Context, name, archive string, sp spec, ru rule, cutoff time.Time, keys [][]any) (moved, removed int64, err error) {
	tuple := "(" + strings.TrimSuffix(strings.Repeat("?, ", len(sp.pk)), ", ") + ")"
	in := "(" + strings.Join(sp.pk, ", ") + ") IN (" + strings.TrimSuffix(strings.Repeat(tuple+", ", len(keys)), ", ") + ")"
	var keyArgs []any
	for _, k := range keys {
		keyArgs = append(keyArgs, k...)
	}
	tx, err := a.cfg.DB.BeginTxx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("archive: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	where := in + " AND " + ru.where
	args := append(append([]any{}, keyArgs...), cutoffArgs(ru, cutoff)...)
	rows, err := tx.QueryxContext(ctx, "SELECT "+strings.Join(sp.pk, ", ")+" FROM "+name+" WHERE "+where+" FOR UPDATE", args...)
	if err != nil {
		return 0, 0, fmt.Errorf("archive: lock %s: %w", name, err)
	}
	locked, err := scanKeys(rows)
	if err != nil {
		return 0, 0, fmt.Errorf("archive: lock %s: %w", name, err)
	}
	if len(locked) == 0 {
		return 0, 0, tx.Commit()
	}
	lockedIn := "(" + strings.Join(sp.pk, ", ") + ") IN (" + strings.TrimSuffix(strings.Repeat(tuple+", ", len(locked)), ", ") + ")"
	var lockedArgs []any
	for _, k := range locked {
		lockedArgs = append(lockedArgs, k...)
	}
	if a.cfg.Move {
		if _, err := tx.ExecContext(ctx, "REPLACE INTO "+archive+" SELECT * FROM "+name+" WHERE "+lockedIn, lockedArgs...); err != nil {
			return 0, 0, fmt.Errorf("archive: copy to %s: %w", archive, err)
		}
		moved = int64(len(locked))
	}
	res, err := tx.ExecContext(ctx, "DELETE FROM "+name+" WHERE "+lockedIn, lockedArgs...)
	if err != nil {
		return 0, 0, fmt.Errorf("archive: delete %s: %w", name, err)
	}
	removed, _ = res.RowsAffected()
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("archive: commit %s: %w", name, err)
	}
	return moved, removed, nil
}

// scanKeys reads primary-key tuples, turning byte slices into strings so they
// bind back as text.
func scanKeys(rows *sqlx.Rows) ([][]any, error) {
	defer rows.Close()
	var keys [][]any
	for rows.Next() {
		k, err := rows.SliceScan()
		if err != nil {
			return nil, err
		}
		for i, v := range k {
			if b, ok := v.([]byte); ok {
				k[i] = string(b)
			}
		}
		keys = append(keys, k)
	}
	return keys, rows.Err()
}
