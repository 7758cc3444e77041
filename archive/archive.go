package archive

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/retire"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
)

// DefaultPrefix is the prefix of every rmqtx table unless configured (an
// empty prefix means it): the one rmqtx default (internal/sqlname).
const DefaultPrefix = sqlname.DefaultPrefix

// DefaultTablePrefix is the old name of DefaultPrefix.
//
// Deprecated: use DefaultPrefix.
const DefaultTablePrefix = DefaultPrefix

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

type retentionTooShort struct{ detail string }

func (e retentionTooShort) Error() string {
	if e.detail == "" {
		return "archive: invalid config: retention shorter than the safe minimum"
	}
	return "archive: invalid config: " + e.detail
}

// Is makes every retention error match ErrRetentionTooShort and ErrConfig.
func (retentionTooShort) Is(target error) bool {
	_, ok := target.(retentionTooShort)
	return ok || target == ErrConfig
}

// Config configures an Archiver.
type Config struct {
	// DB holds the tables. Required.
	DB *sqlx.DB
	// TablePrefix of all rmqtx tables. Default DefaultPrefix.
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
	// RowsPerSecond paces Run: a batch starts only when the rows removed
	// so far fit this rate (golang.org/x/time/rate, one batch of burst).
	// 0, the default, runs the batches back to back. A backlog drains
	// fastest unpaced, but an unpaced archiver competes with the services
	// for the database's CPU and raises their tail latency; in steady state
	// it only has to remove what they write, so a rate a few times the
	// write rate keeps up at a fraction of the cost (BENCHMARKS.md, Scale).
	RowsPerSecond float64
	// Move copies rows to <table>_archive (created LIKE the table when
	// missing) in the same transaction as the delete, instead of only
	// deleting them. A row archived twice (same key) is replaced.
	Move bool
	// Now returns the current time; cutoffs are Now() - retention. Default
	// time.Now. Timestamps in the tables are UTC.
	Now func() time.Time
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), as in every rmqtx Config, so one Observe value can be handed
	// to every component. The archiver logs one line per table to Logger
	// (default quiet); it records no metrics and no spans, so Metrics and
	// TracerProvider are not used.
	observe.Observe
}

// WithDefaults returns a copy of c with every unset field at its default.
func (c Config) WithDefaults() Config {
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultPrefix
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
	c.Observe = c.Observe.WithDefaults()
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
	if c.RowsPerSecond < 0 {
		return fmt.Errorf("%w: RowsPerSecond must not be negative", ErrConfig)
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
			return retentionTooShort{fmt.Sprintf("%s %s is below the safe minimum %s", r.name, r.got, r.min)}
		}
	}
	if c.ConsumeLogRetention < c.DeadLetterRetention {
		return retentionTooShort{fmt.Sprintf("DeadLetterRetention %s is above ConsumeLogRetention %s: a dead letter replayed late would miss its dedup row",
			c.DeadLetterRetention, c.ConsumeLogRetention)}
	}
	return nil
}

// rule is one kind of terminal row of a table, as its owner defines it:
// the owner counts and removes them (the in-flight states are never among
// them: I9); this package only applies the retention.
type rule struct {
	name      string // for reports: "SENT", "DEAD", ...
	retention func(Config) time.Duration
	count     func(ctx context.Context, o owners, cutoff time.Time) (int64, error)
	batch     func(ctx context.Context, o owners, cutoff time.Time, limit int, moveTo string) (removed, moved int64, more bool, err error)
}

// owners are the table owners under the configured prefix.
type owners struct {
	db       *sqlx.DB
	txlog    *txlog.Store
	outbox   outbox.Table
	consumer consumer.TableNames
}

func outboxRule(st outbox.Status, ret func(Config) time.Duration) rule {
	return rule{name: string(st), retention: ret,
		count: func(ctx context.Context, o owners, cutoff time.Time) (int64, error) {
			return o.outbox.CountRetirable(ctx, o.db, st, cutoff)
		},
		batch: func(ctx context.Context, o owners, cutoff time.Time, limit int, moveTo string) (int64, int64, bool, error) {
			return o.outbox.RetireBatch(ctx, o.db, st, cutoff, limit, moveTo)
		}}
}

func consumerRule(name string, which consumer.Retirable, ret func(Config) time.Duration) rule {
	return rule{name: name, retention: ret,
		count: func(ctx context.Context, o owners, cutoff time.Time) (int64, error) {
			return o.consumer.CountRetirable(ctx, o.db, which, cutoff)
		},
		batch: func(ctx context.Context, o owners, cutoff time.Time, limit int, moveTo string) (int64, int64, bool, error) {
			return o.consumer.RetireBatch(ctx, o.db, which, cutoff, limit, moveTo)
		}}
}

// specs map each archivable table to its rules.
var specs = map[Table][]rule{
	Txlog: {{name: string(txlog.StateCommitted) + "/" + string(txlog.StateRolledBack),
		retention: func(c Config) time.Duration { return c.TxlogRetention },
		count: func(ctx context.Context, o owners, cutoff time.Time) (int64, error) {
			return o.txlog.CountRetirable(ctx, cutoff)
		},
		batch: func(ctx context.Context, o owners, cutoff time.Time, limit int, moveTo string) (int64, int64, bool, error) {
			return o.txlog.RetireBatch(ctx, cutoff, limit, moveTo)
		}}},
	Outbox: {
		outboxRule(outbox.StatusSent, func(c Config) time.Duration { return c.OutboxRetention }),
		outboxRule(outbox.StatusDead, func(c Config) time.Duration { return c.OutboxDeadRetention }),
	},
	ConsumeLog: {consumerRule(consumer.StatusApplied+"/"+consumer.StatusStale, consumer.RetireConsumeLog,
		func(c Config) time.Duration { return c.ConsumeLogRetention })},
	DeadLetter: {consumerRule(consumer.DeadLetterReplayed+"/"+consumer.DeadLetterDiscarded, consumer.RetireDeadLetters,
		func(c Config) time.Duration { return c.DeadLetterRetention })},
}

// RuleReport is what happened (or would happen) under one rule.
type RuleReport struct {
	Table     string        `json:"table"`
	Rule      string        `json:"rule"`
	Retention time.Duration `json:"retention_ns"`
	Cutoff    time.Time     `json:"cutoff"`
	// Eligible: in a dry run (Plan), the rows matching now; in a Run, the
	// rows it removed, with More set when MaxBatches stopped it first.
	Eligible int64 `json:"eligible"`
	Removed  int64 `json:"removed"` // rows deleted (0 in a dry run)
	Moved    int64 `json:"moved"`   // rows copied to the archive table
	Batches  int   `json:"batches"`
	Missing  bool  `json:"missing,omitempty"` // the table does not exist
	More     bool  `json:"more,omitempty"`    // Run: MaxBatches ended it with rows left
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
	d   dialect.Dialect
	o   owners
}

// New validates cfg (after WithDefaults).
func New(cfg Config) (*Archiver, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	d, err := dialect.For(cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	o := owners{db: cfg.DB}
	if o.txlog, err = txlog.New(cfg.DB, cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if o.outbox, err = outbox.NewTable(cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if o.consumer, err = consumer.Tables(cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &Archiver{cfg: cfg, d: d, o: o}, nil
}

// Config returns the configuration with defaults applied.
func (a *Archiver) Config() Config { return a.cfg }

// Plan counts what Run would remove now (a dry run). It writes nothing. The
// count reads every eligible row, so on large tables it takes a while; Run
// does not count first.
func (a *Archiver) Plan(ctx context.Context) (Report, error) { return a.do(ctx, true) }

// Run removes (or moves) the eligible rows, batch by batch. It returns the
// report as far as it got, also on error.
func (a *Archiver) Run(ctx context.Context) (Report, error) { return a.do(ctx, false) }

func (a *Archiver) do(ctx context.Context, dry bool) (Report, error) {
	rep := Report{DryRun: dry, Move: a.cfg.Move}
	now := a.cfg.Now().UTC()
	for _, t := range a.cfg.Tables {
		name := a.cfg.TablePrefix + string(t)
		exists, err := retire.Exists(ctx, a.cfg.DB, a.d, name)
		if err != nil {
			return rep, fmt.Errorf("archive: %w", err)
		}
		for _, ru := range specs[t] {
			ret := ru.retention(a.cfg)
			rr := RuleReport{Table: name, Rule: ru.name, Retention: ret, Cutoff: now.Add(-ret), Missing: !exists}
			if !exists {
				rep.Rules = append(rep.Rules, rr)
				continue
			}
			if dry {
				if rr.Eligible, err = ru.count(ctx, a.o, rr.Cutoff); err != nil {
					rep.Rules = append(rep.Rules, rr)
					return rep, fmt.Errorf("archive: count %s: %w", name, err)
				}
			} else {
				// No count first: it would read every eligible row before
				// removing any (seconds at millions of rows, for a figure
				// the batches give anyway).
				err = a.runRule(ctx, name, ru, &rr)
				rr.Eligible = rr.Removed
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

func (a *Archiver) runRule(ctx context.Context, name string, ru rule, rr *RuleReport) error {
	moveTo := ""
	if a.cfg.Move {
		moveTo = name + "_archive"
	}
	var lim *rate.Limiter
	if a.cfg.RowsPerSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(a.cfg.RowsPerSecond), a.cfg.Batch)
	}
	for a.cfg.MaxBatches == 0 || rr.Batches < a.cfg.MaxBatches {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("archive: %s: %w", name, err)
		}
		if lim != nil {
			if err := lim.WaitN(ctx, a.cfg.Batch); err != nil {
				rr.More = true
				if ctx.Err() == nil {
					// The wait would outlast ctx's deadline: stop now,
					// as an unpaced run would at the deadline.
					err = context.DeadlineExceeded
				}
				return fmt.Errorf("archive: %s: %w", name, err)
			}
		}
		removed, moved, more, err := ru.batch(ctx, a.o, rr.Cutoff, a.cfg.Batch, moveTo)
		if removed > 0 || moved > 0 || more || err != nil {
			rr.Batches++
		}
		rr.Moved += moved
		rr.Removed += removed
		if err != nil {
			return fmt.Errorf("archive: %s: %w", name, err)
		}
		if !more {
			return nil
		}
	}
	rr.More = true
	return nil
}
