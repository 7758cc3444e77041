package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/archive"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
)

var errHelp = flag.ErrHelp

// parse parses flags and positional arguments in any order.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageErr("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func newFlags(name string, stderr io.Writer, o *options, env func(string) string) *flag.FlagSet {
	fs := flag.NewFlagSet("rmqtx "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs, env)
	return fs
}

// open connects to the database the DSN names (MySQL or PostgreSQL). The
// config goes to the driver as a connector, never as a DSN string, so no DSN
// exists to end up in an error; errors name only the database, address and
// user.
func open(ctx context.Context, o *options) (*sqlx.DB, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	t, err := o.target()
	if err != nil {
		return nil, err
	}
	db, err := t.connect()
	if err != nil {
		return nil, fmt.Errorf("open database at %s: %w", t.addr, err)
	}
	if err := db.PingContext(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("connect to database %s at %s as %s: %w", t.name, t.addr, t.user, err)
	}
	return db, nil
}

func (o *options) inspector(db *sqlx.DB, lookup bool) (*inspect.Inspector, error) {
	now, err := o.clock()
	if err != nil {
		return nil, err
	}
	cfg := inspect.Config{DB: db, TablePrefix: o.prefix, Redact: o.payloadRedactor(), Now: now}
	if lookup && (len(o.nameServers()) > 0 || o.broker != "") {
		cfg.Broker = inspect.RemotingLookup{NameServers: o.nameServers(), Brokers: splitList(o.broker)}
	}
	return inspect.New(cfg)
}

// withDB runs fn with the database open, under the --timeout deadline, and
// closes it after.
func (o *options) withDB(ctx context.Context, fn func(context.Context, *sqlx.DB) (int, error)) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	db, err := open(ctx, o)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	return fn(ctx, db)
}

// withInspector runs fn with an Inspector over the open database (lookup:
// with the broker lookup when one is configured).
func (o *options) withInspector(ctx context.Context, lookup bool, fn func(context.Context, *inspect.Inspector) (int, error)) (int, error) {
	return o.withDB(ctx, func(ctx context.Context, db *sqlx.DB) (int, error) {
		in, err := o.inspector(db, lookup)
		if err != nil {
			return 0, err
		}
		return fn(ctx, in)
	})
}

// output writes v as JSON with --json; otherwise human writes the table.
func (o *options) output(w io.Writer, v any, human func() error) error {
	if o.json {
		return writeJSON(w, v)
	}
	return human()
}

// findings is the exit code of a command that found (or not) something that
// needs attention.
func findings(found bool) int {
	if found {
		return exitFindings
	}
	return exitOK
}

// anyParked reports whether a dead letter still waits for an operator.
func anyParked(rows []inspect.DeadLetterRow) bool {
	return slices.ContainsFunc(rows, func(d inspect.DeadLetterRow) bool { return d.Status == consumer.DeadLetterParked })
}

func cmdConfig(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("config", stderr, &o, env)
	if _, err := o.parse(fs, args); err != nil {
		return 0, err
	}
	if err := o.validate(); err != nil {
		return 0, err
	}
	t, err := o.target()
	if err != nil {
		return 0, err
	}
	v := map[string]any{"driver": t.driver, "dsn": t.masked, "namesrv": o.nameServers(), "broker": splitList(o.broker), "table_prefix": o.prefix,
		"payloads": o.payloadMode()}
	return exitOK, o.output(stdout, v, func() error {
		w := newTable(stdout)
		w.row("driver", t.driver)
		w.row("dsn", t.masked)
		w.row("namesrv", strings.Join(o.nameServers(), ","))
		w.row("broker", strings.Join(splitList(o.broker), ","))
		w.row("table prefix", o.prefix)
		w.row("payloads", o.payloadMode())
		return w.flush()
	})
}

func cmdInspect(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("inspect", stderr, &o, env)
	key := fs.String("business-key", "", "inspect every event of this business key")
	noBroker := fs.Bool("no-broker", false, "skip the broker lookup (done when a name server or broker is configured)")
	limit := fs.Int("limit", 20, "at most this many events for --business-key")
	pos, err := o.parse(fs, args)
	if err != nil {
		return 0, err
	}
	if (*key == "") == (len(pos) != 1) || len(pos) > 1 {
		return 0, usageErr("give exactly one event id, or --business-key K")
	}
	return o.withInspector(ctx, !*noBroker, func(ctx context.Context, in *inspect.Inspector) (int, error) {
		now, _ := o.clock()
		var views []inspect.EventView
		var lookupErr error
		if *key != "" {
			views, lookupErr = in.BusinessKey(ctx, *key, *limit)
		} else {
			var v inspect.EventView
			v, lookupErr = in.Event(ctx, pos[0])
			views = []inspect.EventView{v}
		}
		notFound := errors.Is(lookupErr, inspect.ErrNotFound)
		if lookupErr != nil && !notFound {
			return 0, lookupErr
		}
		err := o.output(stdout, views, func() error {
			if notFound {
				fmt.Fprintf(stdout, "not found: %v\n", lookupErr)
				return nil
			}
			for k, v := range views {
				if k > 0 {
					fmt.Fprintln(stdout)
				}
				if err := printEvent(stdout, v, now()); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
		return findings(notFound || slices.ContainsFunc(views, needsAttention)), nil
	})
}

// needsAttention: something about the event is unfinished or failed.
func needsAttention(v inspect.EventView) bool {
	if !v.Found() || len(v.Attempts) > 0 || len(v.BrokerErrors) > 0 {
		return true
	}
	if v.Outbox != nil && v.Outbox.Status != string(outbox.StatusSent) {
		return true
	}
	return anyParked(v.DeadLetters)
}

func cmdStuck(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("stuck", stderr, &o, env)
	older := fs.Duration("older-than", time.Minute, "only work older than this")
	limit := fs.Int("limit", 100, "at most this many rows per table")
	if _, err := o.parse(fs, args); err != nil {
		return 0, err
	}
	return o.withInspector(ctx, false, func(ctx context.Context, in *inspect.Inspector) (int, error) {
		rows, missing, err := in.Stuck(ctx, *older, *limit)
		if err != nil {
			return 0, err
		}
		err = o.output(stdout, map[string]any{"stuck": rows, "missing_tables": missing}, func() error {
			return printStuck(stdout, rows, missing, *older)
		})
		if err != nil {
			return 0, err
		}
		return findings(len(rows) > 0), nil
	})
}

// selectorFlags are the dead-letter selectors shared by dead list and replay.
type selectorFlags struct {
	ids                           string
	group, topic, typ, key, class string
	since, until                  string
	status                        string
	includeReplayed               bool
	limit                         int
}

func (s *selectorFlags) register(fs *flag.FlagSet, withStatus bool) {
	fs.StringVar(&s.ids, "id", "", "dead-letter ids, comma separated")
	fs.StringVar(&s.group, "group", "", "consumer group")
	fs.StringVar(&s.topic, "topic", "", "original topic")
	fs.StringVar(&s.typ, "type", "", "event type")
	fs.StringVar(&s.key, "key", "", "business key")
	fs.StringVar(&s.class, "class", "", "error class (transient, wait, permanent, data, conflict, unknown)")
	fs.StringVar(&s.since, "since", "", "first parked at or after (UTC, RFC 3339 or 2006-01-02 15:04:05)")
	fs.StringVar(&s.until, "until", "", "first parked before (UTC)")
	fs.IntVar(&s.limit, "limit", 100, "at most this many dead letters")
	if withStatus {
		fs.StringVar(&s.status, "status", "", "PARKED, REPLAYED or DISCARDED (default all)")
	} else {
		fs.BoolVar(&s.includeReplayed, "include-replayed", false, "also select dead letters already REPLAYED (sent again; the consumer dedups)")
	}
}

func (s *selectorFlags) selector() (replay.Selector, error) {
	sel := replay.Selector{ConsumerGroup: s.group, Topic: s.topic, EventType: s.typ, BusinessKey: s.key, ErrorClass: s.class,
		IncludeReplayed: s.includeReplayed, Limit: s.limit}
	for _, p := range splitList(s.ids) {
		id, err := strconv.ParseInt(p, 10, 64)
		if err != nil || id <= 0 {
			return sel, usageErr("--id: %q is not a dead-letter id", p)
		}
		sel.IDs = append(sel.IDs, id)
	}
	var err error
	if sel.Since, err = parseTime(s.since); err != nil {
		return sel, err
	}
	if sel.Until, err = parseTime(s.until); err != nil {
		return sel, err
	}
	return sel, nil
}

func cmdDeadList(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("dead list", stderr, &o, env)
	var sf selectorFlags
	sf.register(fs, true)
	if _, err := o.parse(fs, args); err != nil {
		return 0, err
	}
	sel, err := sf.selector()
	if err != nil {
		return 0, err
	}
	return o.withInspector(ctx, false, func(ctx context.Context, in *inspect.Inspector) (int, error) {
		rows, err := in.DeadLetters(ctx, inspect.DeadLetterFilter{IDs: sel.IDs, ConsumerGroup: sel.ConsumerGroup, Topic: sel.Topic,
			Status: sf.status, EventType: sel.EventType, BusinessKey: sel.BusinessKey, ErrorClass: sel.ErrorClass,
			Since: sel.Since, Until: sel.Until, Limit: sel.Limit})
		if err != nil {
			return 0, err
		}
		if err := o.output(stdout, rows, func() error { return printDeadList(stdout, rows) }); err != nil {
			return 0, err
		}
		return findings(anyParked(rows)), nil
	})
}

func cmdDeadShow(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("dead show", stderr, &o, env)
	pos, err := o.parse(fs, args)
	if err != nil {
		return 0, err
	}
	if len(pos) != 1 {
		return 0, usageErr("give one dead-letter id")
	}
	id, err := strconv.ParseInt(pos[0], 10, 64)
	if err != nil {
		return 0, usageErr("%q is not a dead-letter id", pos[0])
	}
	return o.withInspector(ctx, false, func(ctx context.Context, in *inspect.Inspector) (int, error) {
		d, err := in.DeadLetter(ctx, id)
		if errors.Is(err, inspect.ErrNotFound) {
			fmt.Fprintf(stdout, "not found: dead letter %d\n", id)
			return exitFindings, nil
		}
		if err != nil {
			return 0, err
		}
		return exitOK, o.output(stdout, d, func() error { return printDeadLetter(stdout, d) })
	})
}

func cmdReplay(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("replay", stderr, &o, env)
	var sf selectorFlags
	sf.register(fs, false)
	dry := fs.Bool("dry-run", false, "show what would be replayed; send nothing")
	rateF := fs.Float64("rate", 5, "messages per second")
	batch := fs.Int("batch", 10, "messages between two checks for new dead letters")
	stopAfter := fs.Int("stop-after", 10, "stop once this many new dead letters appear (negative: never)")
	reason := fs.String("reason", "", "why (required; stored in the audit row)")
	operator := fs.String("operator", env("USER"), "who (required; default $USER)")
	if _, err := o.parse(fs, args); err != nil {
		return 0, err
	}
	sel, err := sf.selector()
	if err != nil {
		return 0, err
	}
	if sel.Empty() {
		return 0, usageErr("name what to replay: --id, --group, --topic, --type, --key, --class, --since or --until")
	}
	if *rateF <= 0 || *batch <= 0 {
		return 0, usageErr("--rate and --batch must be positive")
	}
	if !*dry && (strings.TrimSpace(*reason) == "" || strings.TrimSpace(*operator) == "") {
		return 0, usageErr("--reason and --operator are required (they go to the audit row)")
	}
	if !*dry && len(o.nameServers()) == 0 {
		return 0, usageErr("a name server is required to replay: --namesrv or RMQTX_NAMESRV")
	}
	return o.withDB(ctx, func(ctx context.Context, db *sqlx.DB) (int, error) {
		r, err := replay.New(replay.Config{DB: db, TablePrefix: o.prefix, NameServers: o.nameServers(), Rate: *rateF, Batch: *batch,
			StopAfterNewDeadLetters: *stopAfter})
		if err != nil {
			return 0, err
		}
		if *dry {
			p, err := r.DryRun(ctx, sel)
			if err != nil {
				return 0, err
			}
			return exitOK, o.output(stdout, p, func() error { return printPlan(stdout, p) })
		}
		if err := r.Start(ctx); err != nil {
			return 0, err
		}
		defer r.Close()
		rep, err := r.Replay(ctx, replay.Request{Selector: sel, Operator: *operator, Reason: *reason})
		if err != nil && rep.AuditID == 0 {
			return 0, err
		}
		if werr := o.output(stdout, rep, func() error { return printReplay(stdout, rep) }); werr != nil {
			return 0, werr
		}
		switch {
		case err != nil || rep.Result == replay.ResultFailed || rep.Result == replay.ResultCanceled:
			if err == nil {
				err = fmt.Errorf("replay %s", strings.ToLower(string(rep.Result)))
			}
			return 0, err
		case rep.Result == replay.ResultStopped || rep.Result == replay.ResultPartial:
			return exitFindings, nil
		}
		return exitOK, nil
	})
}

func cmdArchive(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("archive", stderr, &o, env)
	dry := fs.Bool("dry-run", false, "count what would be removed; change nothing")
	move := fs.Bool("move", false, "copy rows to <table>_archive before deleting them")
	batch := fs.Int("batch", 500, "rows per delete transaction")
	pace := fs.Float64("rows-per-second", 0, "pace the removal to this many rows per second (0: batches back to back)")
	tables := fs.String("tables", "", "comma separated subset of txlog,outbox,consume_log,dead_letter (default all)")
	var cfg archive.Config
	fs.DurationVar(&cfg.TxlogRetention, "txlog-retention", archive.DefaultTxlogRetention, "txlog retention (min 24h)")
	fs.DurationVar(&cfg.OutboxRetention, "outbox-retention", archive.DefaultOutboxRetention, "outbox SENT retention (min 1h)")
	fs.DurationVar(&cfg.OutboxDeadRetention, "outbox-dead-retention", archive.DefaultOutboxDeadRetention, "outbox DEAD retention (min 24h)")
	fs.DurationVar(&cfg.ConsumeLogRetention, "consume-log-retention", archive.DefaultConsumeLogRetention, "consume log retention (min 72h, >= dead-letter retention)")
	fs.DurationVar(&cfg.DeadLetterRetention, "dead-letter-retention", archive.DefaultDeadLetterRetention, "REPLAYED/DISCARDED dead-letter retention (min 24h)")
	if _, err := o.parse(fs, args); err != nil {
		return 0, err
	}
	for _, t := range splitList(*tables) {
		cfg.Tables = append(cfg.Tables, archive.Table(t))
	}
	now, err := o.clock()
	if err != nil {
		return 0, err
	}
	cfg.Now, cfg.Move, cfg.Batch, cfg.TablePrefix, cfg.RowsPerSecond = now, *move, *batch, o.prefix, *pace
	return o.withDB(ctx, func(ctx context.Context, db *sqlx.DB) (int, error) {
		cfg.DB = db
		a, err := archive.New(cfg)
		if errors.Is(err, archive.ErrConfig) || errors.Is(err, archive.ErrRetentionTooShort) {
			return 0, usageErr("%v", err)
		}
		if err != nil {
			return 0, err
		}
		var rep archive.Report
		if *dry {
			rep, err = a.Plan(ctx)
		} else {
			rep, err = a.Run(ctx)
		}
		if werr := o.output(stdout, rep, func() error { return printArchive(stdout, rep) }); werr != nil {
			return 0, werr
		}
		return exitOK, err
	})
}

func cmdStats(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	var o options
	fs := newFlags("stats", stderr, &o, env)
	if _, err := o.parse(fs, args); err != nil {
		return 0, err
	}
	return o.withInspector(ctx, false, func(ctx context.Context, in *inspect.Inspector) (int, error) {
		rows, missing, err := in.Stats(ctx)
		if err != nil {
			return 0, err
		}
		return exitOK, o.output(stdout, map[string]any{"stats": rows, "missing_tables": missing}, func() error {
			return printStats(stdout, rows, missing)
		})
	})
}
