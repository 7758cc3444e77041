package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmqtx/rmqtx/archive"
	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/dropdb"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// The scale workload (issue 35): how rmqtx's hot paths and its tooling
// behave as the tables grow. For each database, id layout and size it makes
// a fresh database, migrates rmqtx's schema, bulk-loads the txlog, the
// consume log and the outbox with N rows each in the shape weeks of traffic
// leave (scale_preload.go), and measures, round by round, what a service
// pays at that size. Each measure's rate is compared with the same measure
// on empty tables (size 0) of the same database and id layout.

// Targets of the scale curve (issue 35).
const (
	targetScaleVsEmpty   = 0.85 // throughput at N rows within 15 % of empty tables
	targetArchiveKeepUp  = 5.0  // archival removes rows at >= 5x the rate Send writes them
	targetArchiveP99Rise = 1.20 // Send p99 with archival running / without <= 1.20
	scaleClaimRows       = 2000 // outbox rows enqueued per claim round
)

// Measures of one scale point, in the order they run within a round.
const (
	scaleSend          = "Send"
	scaleFirst         = "first delivery"
	scaleDup           = "cold duplicate"
	scaleCheck         = "check-back read"
	scaleCheckRecent   = "check-back read, recent"
	scaleClaim         = "outbox claim"
	scaleStuck         = "stuck"
	scaleInspect       = "inspect"
	scaleSendPlain     = "Send, archival off"
	scaleSendArch      = "Send + archival"
	scaleArchival      = "archival (txlog)"
	scaleSendPaced     = "Send + archival paced at 5x"
	scaleArchivalPaced = "archival (txlog) paced at 5x"
)

// scaleFlags are the -scale-* command-line flags.
type scaleFlags struct {
	Rows    string
	DB      string
	IDs     string
	Archive bool
}

// registerScaleFlags adds the -scale-* flags to fs.
func registerScaleFlags(fs *flag.FlagSet, f *scaleFlags) {
	fs.StringVar(&f.Rows, "scale-rows", "0,1000000", "scale: rows preloaded into the txlog, the consume log and the outbox at each point of the curve, comma-separated (k and M suffixes allowed, e.g. 0,1M,10M); include 0 for the ratios to empty tables")
	fs.StringVar(&f.DB, "scale-db", "both", "scale: database(s) of the curve: mysql, postgres or both")
	fs.StringVar(&f.IDs, "scale-ids", "both", "scale: id layout(s): time (ids assigned by rmqtx, UUIDv7), hashed (UUIDv5 of a business key) or both")
	fs.BoolVar(&f.Archive, "scale-archive", false, "scale: at every size above 0 also run Send rounds with the archiver (package archive, txlog, default retention) working at the same time")
}

// scalePlan is the parsed flags.
type scalePlan struct {
	Rows    []int64
	DBs     []string
	IDs     []string
	Archive bool
}

// plan parses and checks the flags.
func (f scaleFlags) plan() (scalePlan, error) {
	rows, err := parseScaleRows(f.Rows)
	if err != nil {
		return scalePlan{}, err
	}
	dbs, err := parseScaleChoice("-scale-db", f.DB, engineMySQL, enginePostgres)
	if err != nil {
		return scalePlan{}, err
	}
	ids, err := parseScaleChoice("-scale-ids", f.IDs, idsTime, idsHashed)
	if err != nil {
		return scalePlan{}, err
	}
	return scalePlan{Rows: rows, DBs: dbs, IDs: ids, Archive: f.Archive}, nil
}

// parseScaleRows parses "0,1000000,10M": sizes in ascending order, no
// duplicates.
func parseScaleRows(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		mul := int64(1)
		switch {
		case strings.HasSuffix(f, "M"), strings.HasSuffix(f, "m"):
			mul, f = 1_000_000, f[:len(f)-1]
		case strings.HasSuffix(f, "k"), strings.HasSuffix(f, "K"):
			mul, f = 1_000, f[:len(f)-1]
		}
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil || n < 0 || n > math.MaxInt64/mul {
			return nil, fmt.Errorf("-scale-rows: %q is not a row count", f)
		}
		out = append(out, n*mul)
	}
	if len(out) == 0 {
		return nil, errors.New("-scale-rows: no sizes")
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// parseScaleChoice parses one of all, or "both" (every one of all).
func parseScaleChoice(name, s string, all ...string) ([]string, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	switch v {
	case "both", "all":
		return all, nil
	case "mariadb", "mysql":
		v = engineMySQL
	case "pg", "postgresql":
		v = enginePostgres
	}
	if slices.Contains(all, v) {
		return []string{v}, nil
	}
	return nil, fmt.Errorf("%s: %q is not one of %s or both", name, s, strings.Join(all, ", "))
}

// fmtRows writes a size the way the flag takes it: 0, 20k, 1M, 1500000.
func fmtRows(n int64) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return strconv.FormatInt(n/1_000_000, 10) + "M"
	case n >= 1_000 && n%1_000 == 0:
		return strconv.FormatInt(n/1_000, 10) + "k"
	}
	return strconv.FormatInt(n, 10)
}

// scaleLabel names a point: "mysql/time/1M".
func scaleLabel(db, ids string, rows int64) string {
	return db + "/" + ids + "/" + fmtRows(rows)
}

// ScaleMeasure is one measure at one point, for the JSON.
type ScaleMeasure struct {
	Name  string  `json:"name"`
	Unit  string  `json:"unit"`
	Rate  float64 `json:"rate"`
	P50Ms float64 `json:"p50_ms,omitempty"`
	P99Ms float64 `json:"p99_ms,omitempty"`
	// MeanClaimMs is the outbox claim transaction's mean time (outbox
	// claim only), from the dispatcher's own histogram.
	MeanClaimMs float64 `json:"mean_claim_ms,omitempty"`
	// PerOp is what an operation cost the servers (serverProbe: CPU per
	// process, cores busy, InnoDB's counters on MariaDB), medians of rounds.
	PerOp map[string]float64 `json:"per_op,omitempty"`
	// VsEmpty is the median per-round ratio of Rate to the same measure at
	// size 0 (null at size 0); Met says whether it is >= 0.85.
	VsEmpty *float64 `json:"vs_empty,omitempty"`
	Met     *bool    `json:"met,omitempty"`
}

// ScaleArchive is what archival did during the Send rounds of one point.
type ScaleArchive struct {
	Eligible        int64   `json:"eligible"` // txlog rows past retention when the first round started
	Removed         int64   `json:"removed"`
	RowsPerSec      float64 `json:"archived_rows_per_s"` // median over the rounds that had rows left
	SendRate        float64 `json:"send_rate"`           // tx/s, archival off (same rounds)
	SendRateWith    float64 `json:"send_rate_with"`      // tx/s, archival on
	SendP99Ms       float64 `json:"send_p99_ms"`
	SendP99MsWith   float64 `json:"send_p99_ms_with"`
	KeepUp          float64 `json:"keep_up"`        // archived rows/s / Send tx/s (target >= 5)
	P99Rise         float64 `json:"p99_rise"`       // Send p99 with unpaced archival / without (no target)
	P99RisePaced    float64 `json:"p99_rise_paced"` // Send p99 with archival paced at 5x Send's rate / without (target <= 1.20)
	SendP99MsPaced  float64 `json:"send_p99_ms_paced"`
	PacedRowsPerSec float64 `json:"paced_rows_per_s"`
	KeepUpMet       *bool   `json:"keep_up_met,omitempty"`
	P99Met          *bool   `json:"p99_met,omitempty"`
	DrainedInRound  int     `json:"drained_in_round,omitempty"` // round in which nothing eligible was left (0: never)
}

// ScalePoint is one point of the curve: a database, an id layout, a size.
type ScalePoint struct {
	DB                string         `json:"db"`
	IDs               string         `json:"ids"`
	Rows              int64          `json:"rows"` // per table
	PreloadRows       int64          `json:"preload_rows"`
	PreloadSeconds    float64        `json:"preload_seconds"`
	PreloadRowsPerSec float64        `json:"preload_rows_per_s"`
	AnalyzeSeconds    float64        `json:"analyze_seconds"`
	Measures          []ScaleMeasure `json:"measures"`
	Archive           *ScaleArchive  `json:"archive,omitempty"`
	Error             string         `json:"error,omitempty"`
}

func (p *ScalePoint) measure(name string) *ScaleMeasure {
	for i := range p.Measures {
		if p.Measures[i].Name == name {
			return &p.Measures[i]
		}
	}
	return nil
}

// runScale runs the scale curve (-workloads scale).
func runScale(ctx context.Context, e *Env) *Workload {
	o := e.Opt
	w := &Workload{Name: "scale", Params: map[string]string{
		"rows": o.Scale.Rows, "db": o.Scale.DB, "ids": o.Scale.IDs, "archive": strconv.FormatBool(o.Scale.Archive),
		"concurrency": fmt.Sprint(o.Concurrency), "round": roundDesc(o), "rounds": fmt.Sprint(o.Rounds), "payload": fmt.Sprint(o.Payload),
	}}
	plan, err := o.Scale.plan()
	if err != nil {
		w.Error = err.Error()
		return w
	}
	var errs []string
	k := 0
	for _, db := range plan.DBs {
		for _, ids := range plan.IDs {
			var pts []*ScalePoint
			sides := map[int64][]*Side{}
			for _, n := range plan.Rows {
				if ctx.Err() != nil {
					break
				}
				k++
				pt := &ScalePoint{DB: db, IDs: ids, Rows: n}
				e.Log("  scale point %s", scaleLabel(db, ids, n))
				ss, err := runScalePoint(ctx, e, k, pt, plan.Archive, w)
				if err != nil {
					pt.Error = err.Error()
					errs = append(errs, scaleLabel(db, ids, n)+": "+err.Error())
					e.Log("  scale point %s: %v", scaleLabel(db, ids, n), err)
				}
				w.Sides = append(w.Sides, ss...)
				sides[n] = ss
				pts = append(pts, pt)
				w.Scale = append(w.Scale, pt)
			}
			scaleRatios(w, pts, sides)
			w.Notes = append(w.Notes, scaleCurveNote(db, ids, pts))
		}
	}
	w.Notes = append(w.Notes,
		"each point is a fresh database: rmqtx's schema migrated, then the txlog, the consume log and the outbox bulk-loaded with N rows each (INSERT ... SELECT from MariaDB's SEQUENCE engine / PostgreSQL's generate_series, 1M rows a statement), then ANALYZE",
		"row shape: timestamps spread over 4 weeks, oldest first; txlog 98% COMMITTED (payload, hash, envelope properties with the half's UNIQ_KEY), 2% ROLLED_BACK fences; outbox SENT except the newest 0.1% up to 1,000 rows (RETRY, next try in an hour); consume log SUCCESS except the same newest rows, which are consume_attempt rows being retried",
		"id layouts: time = UUIDv7 ids (rmqtx assigns them: preloaded ids carry their row's timestamp, Sends let txproducer assign one); hashed = ids from business keys (preloaded: MD5 of the key in UUIDv5 layout; Sends: UUIDv5 of the event type and a new order key, as the README recommends), so inserts land on random B-tree pages",
		"Send: txproducer.Send on the preloaded txlog (same producer group), real broker, business INSERT in the local tx; first delivery: consumer.Processor.Process of new events (dedup INSERT + business INSERT), no broker; cold duplicate: a second Processor with its dedup cache off, redelivering random preloaded applied events (at size 0: events the first-delivery rounds applied)",
		"check-back read: checkback.Checker.CheckQuery of random preloaded COMMITTED ids (at size 0: ids the Send rounds committed), must answer COMMIT from the row, one at a time as the client answers checks; check-back read, recent: the same for ids the Send rounds of the point committed, at every size (a real check asks about a recent half); outbox claim: "+fmt.Sprint(scaleClaimRows)+" rows enqueued per round and drained by an outbox.Dispatcher with a no-op sink (rate = rows/s; mean claim transaction in the note); stuck: inspect.Inspector.Stuck(1m, 100) as `rmqtx stuck`; inspect: Inspector.Event of random ids as `rmqtx inspect ID --no-broker`",
		fmt.Sprintf("ratio X / 0 rows: median of the per-round ratios of a measure's rate at N rows to the same measure on empty tables (same database and id layout); target >= %.2fx (within 15%% of empty tables)", targetScaleVsEmpty),
	)
	if plan.Archive {
		w.Notes = append(w.Notes, fmt.Sprintf("archival: per round, a Send round with nothing else running, then one with archive.Archiver.Run (txlog only, default retention %s, batch 500, delete) started with it and stopped when it ends, unpaced (its capacity), then one with Run paced at 5x the first round's Send rate (Config.RowsPerSecond: what keeping up at the target costs); rows/s = rows removed / time until nothing was left or the round ended; targets: unpaced archived rows/s >= %.0fx Send tx/s of the same round, Send p99 with the paced archiver / without <= %.2fx (printed as without / with >= %.2fx)",
			archive.DefaultTxlogRetention, targetArchiveKeepUp, targetArchiveP99Rise, 1/targetArchiveP99Rise))
	}
	if len(errs) > 0 {
		w.Error = strings.Join(errs, "; ")
	}
	return w
}

// scaleRatios adds, for every point above size 0, each measure's ratio to
// the same measure at size 0, and fills the points' VsEmpty.
func scaleRatios(w *Workload, pts []*ScalePoint, sides map[int64][]*Side) {
	base, ok := sides[0]
	if !ok {
		return
	}
	byName := func(ss []*Side, name string) *Side {
		for _, s := range ss {
			if strings.HasSuffix(s.Name, " "+name) {
				return s
			}
		}
		return nil
	}
	for _, pt := range pts {
		if pt.Rows == 0 {
			continue
		}
		for i := range pt.Measures {
			m := &pt.Measures[i]
			num, den := byName(sides[pt.Rows], m.Name), byName(base, m.Name)
			if num == nil || den == nil || len(num.Rounds) == 0 || len(den.Rounds) == 0 {
				continue
			}
			r := NewRatio(scaleLabel(pt.DB, pt.IDs, pt.Rows)+" "+m.Name+" / 0 rows", num, den, targetScaleVsEmpty)
			w.Ratios = append(w.Ratios, r)
			if !math.IsNaN(r.Value) {
				v := r.Value
				m.VsEmpty, m.Met = &v, r.Met
			}
		}
	}
}

// scaleCurveNote is one line per (database, id layout): each measure's
// rate at every size.
func scaleCurveNote(db, ids string, pts []*ScalePoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "curve %s/%s:", db, ids)
	for _, name := range []string{scaleSend, scaleFirst, scaleDup, scaleCheck, scaleCheckRecent, scaleClaim, scaleStuck, scaleInspect} {
		var parts []string
		for _, pt := range pts {
			m := pt.measure(name)
			if m == nil {
				continue
			}
			s := fmtRows(pt.Rows) + "=" + fmtRate(m.Rate)
			if m.VsEmpty != nil {
				s += " (" + fmtRatio(*m.VsEmpty) + ")"
			}
			parts = append(parts, s)
		}
		if len(parts) > 0 {
			fmt.Fprintf(&b, " %s %s;", name, strings.Join(parts, " "))
		}
	}
	return strings.TrimSuffix(b.String(), ";")
}

// scaleEnv creates point k's fresh database on engine and returns an Env
// for it (sharing the run's names, options and broker admin) and the
// function that drops it.
func scaleEnv(ctx context.Context, e *Env, engine string, k int) (*Env, func(), error) {
	s := e.S
	s.Engine = engine
	if err := s.CheckLoopback(); err != nil {
		return nil, nil, err
	}
	root, err := s.Open("")
	if err != nil {
		return nil, nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := root.PingContext(pctx); err != nil {
		_ = root.Close()
		return nil, nil, fmt.Errorf("%s at %s: %w", engine, s.DBAddr(), err)
	}
	name := fmt.Sprintf("rmqtx_bench_%s_s%d", e.Names.Run(), k)
	create := "CREATE DATABASE " + name
	if engine == engineMySQL {
		create += " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
	}
	if _, err := root.ExecContext(pctx, create); err != nil {
		_ = root.Close()
		return nil, nil, fmt.Errorf("create database: %w", err)
	}
	drop := func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := dropdb.Drop(dctx, root, name, engine == enginePostgres); err != nil {
			e.Log("drop database %s: %v", name, err)
		}
		_ = root.Close()
	}
	db, err := s.Open(name)
	if err != nil {
		drop()
		return nil, nil, err
	}
	pool := 4*e.Opt.Concurrency + 32
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool)
	db.SetConnMaxLifetime(0)
	pe := &Env{S: s, DB: db, DBName: name, Names: e.Names, Opt: e.Opt, Log: e.Log, admin: e.admin, root: root}
	return pe, func() { _ = db.Close(); drop() }, nil
}

// idPool keeps ids a point wrote (Sends, first deliveries), for the
// measures that read rows back at size 0, where nothing was preloaded.
type idPool struct {
	mu   sync.Mutex
	ids  []string
	aux  []string // payload hash (Sends) or payload seq (deliveries)
	full bool
}

const idPoolMax = 200_000

func (p *idPool) add(id, aux string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ids) >= idPoolMax {
		p.full = true
		i := rand.IntN(len(p.ids))
		p.ids[i], p.aux[i] = id, aux
		return
	}
	p.ids = append(p.ids, id)
	p.aux = append(p.aux, aux)
}

func (p *idPool) pick() (string, string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.ids) == 0 {
		return "", "", false
	}
	i := rand.IntN(len(p.ids))
	return p.ids[i], p.aux[i], true
}

// scaleSide is one measure of a point: a closed loop (op) or a drain
// (round).
type scaleSide struct {
	side  *Side
	conc  int
	warm  time.Duration
	op    Op
	round func(ctx context.Context, index, rows int, pr *serverProbe) (Round, error)
	close func()
}

// runScalePoint runs one point: database, preload, measures, archival.
func runScalePoint(ctx context.Context, e *Env, k int, pt *ScalePoint, withArchive bool, w *Workload) ([]*Side, error) {
	o := e.Opt
	label := scaleLabel(pt.DB, pt.IDs, pt.Rows)
	pe, drop, err := scaleEnv(ctx, e, pt.DB, k)
	if err != nil {
		return nil, err
	}
	defer drop()

	prefix := sqlname.DefaultPrefix
	if err := schema.MigrateAll(ctx, pe.DB, prefix); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	store, err := txlog.New(pe.DB, prefix)
	if err != nil {
		return nil, err
	}
	obTable, err := outbox.NewTable(prefix)
	if err != nil {
		return nil, err
	}
	ct, err := consumer.Tables(prefix)
	if err != nil {
		return nil, err
	}
	topic := e.Names.Name("stopic")
	if err := pe.CreateTopic(ctx, topic, 4); err != nil {
		return nil, err
	}
	salt := e.Names.Run() + strconv.Itoa(k)
	shape := newPreloadShape(pt.Rows, pt.IDs, salt, o.Payload, time.Now(), e.Names.Name("sgroup"), e.Names.Name("scgroup"), topic)
	tables := preloadTables{Txlog: store.Table(), Outbox: obTable.Name(), ConsumeLog: ct.ConsumeLog, Attempt: ct.Attempt}
	if pt.Rows > 0 {
		chunk := int64(scaleChunk)
		if pt.IDs == idsHashed {
			chunk = scaleChunkHashed
		}
		if err := checkScaleDisk(ctx, pe.DB, pt.DB, pe.S.DBAddr(), pt.Rows, e.Log); err != nil {
			return nil, err
		}
		pr, err := preload(ctx, pe.DB, pt.DB, tables, shape, chunk, e.Log)
		if err != nil {
			return nil, err
		}
		pt.PreloadRows, pt.PreloadSeconds, pt.AnalyzeSeconds = pr.Rows, pr.Seconds, pr.Analyze
		if pr.Seconds > 0 {
			pt.PreloadRowsPerSec = float64(pr.Rows) / pr.Seconds
		}
		line := fmt.Sprintf("preload %s: %d rows (txlog, outbox, consume log + attempts) in %.1fs = %.0f rows/s, ANALYZE %.1fs",
			label, pr.Rows, pr.Seconds, pt.PreloadRowsPerSec, pr.Analyze)
		e.Log("  %s", line)
		w.Notes = append(w.Notes, line)
	}

	sides, err := scaleSides(ctx, pe, pt, shape, store, obTable, topic)
	defer func() {
		for _, s := range sides {
			if s.close != nil {
				s.close()
			}
		}
	}()
	if err != nil {
		return nil, err
	}
	var out []*Side
	for _, s := range sides {
		out = append(out, s.side)
	}
	pr := newServerProbe(pe, pe.DB)
	if err := scaleMeasureRounds(ctx, pe, sides, w, pr); err != nil {
		return out, err
	}
	var probes []string
	for _, s := range sides {
		s.side.Summarize()
		m := ScaleMeasure{Name: strings.TrimPrefix(s.side.Name, label+" "), Unit: s.side.Unit, Rate: s.side.Rate, P50Ms: s.side.P50Ms, P99Ms: s.side.P99Ms, PerOp: probeMedians(s.side.Rounds)}
		if line := probeLine(s.side.Rounds); line != "" {
			probes = append(probes, m.Name+": "+line)
		}
		if s.round != nil {
			m.MeanClaimMs = medianExtra(s.side.Rounds, "mean_claim_ms")
			if !math.IsNaN(m.MeanClaimMs) {
				w.Notes = append(w.Notes, fmt.Sprintf("%s outbox claim: %.2fms per claim transaction (mean, median of rounds), %.1f rows per claim",
					label, m.MeanClaimMs, medianExtra(s.side.Rounds, "rows_per_claim")))
			} else {
				m.MeanClaimMs = 0
			}
		}
		pt.Measures = append(pt.Measures, m)
	}
	if len(probes) > 0 {
		w.Notes = append(w.Notes, label+" per operation (medians of rounds): "+strings.Join(probes, "; "))
	}
	if withArchive && pt.Rows > 0 && ctx.Err() == nil {
		as, err := scaleArchiveRounds(ctx, pe, pt, sides[0], w, pr)
		out = append(out, as...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// scaleSides builds the point's measures; the first is Send.
func scaleSides(ctx context.Context, pe *Env, pt *ScalePoint, shape preloadShape, store *txlog.Store, obTable outbox.Table, topic string) ([]*scaleSide, error) {
	o := pe.Opt
	label := scaleLabel(pt.DB, pt.IDs, pt.Rows)
	hashed := pt.IDs == idsHashed
	prefix := sqlname.DefaultPrefix
	var (
		sides   []*scaleSide
		sent    idPool // Send: event id, payload hash
		applied idPool // first delivery: event id, payload seq
		seqs    atomic.Int64
	)
	dbWarm := min(o.Warmup, 500*time.Millisecond)
	add := func(name, unit, desc string, conc int, warm time.Duration) *scaleSide {
		s := &scaleSide{side: &Side{Name: label + " " + name, Unit: unit, Description: desc}, conc: conc, warm: warm}
		sides = append(sides, s)
		return s
	}
	// oldCommitted picks a random preloaded COMMITTED txlog row.
	oldCommitted := func() int64 {
		seq := 1 + rand.Int64N(shape.Rows)
		if !shape.committed(seq) {
			seq--
		}
		return max(seq, 1)
	}

	// Send.
	biz := pe.Names.Name("orders_scale")
	if err := pe.businessTable(ctx, biz); err != nil {
		return sides, err
	}
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{pe.S.NameServer}, Group: shape.Group, DB: pe.DB, Log: store, WarmupTopics: []string{topic},
	})
	if err != nil {
		return sides, err
	}
	if err := p.Start(ctx); err != nil {
		return sides, fmt.Errorf("txproducer start: %w", err)
	}
	send := add(scaleSend, "tx/s", "txproducer.Send on the preloaded txlog: BEGIN; txlog INSERT; business INSERT; COMMIT; real broker", o.Concurrency, o.Warmup)
	send.close = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Shutdown(sctx)
	}
	insert := pe.insertOrderSQL(biz)
	send.op = func(ctx context.Context, _ int, seq int64) error {
		payload := makePayload(o.Payload, seq)
		msg := txproducer.Message{Topic: topic, Tags: benchEventType, EventType: benchEventType, Payload: payload}
		bizID := wire.NewEventID()
		if hashed {
			key := fmt.Sprintf("order-%s-s%d", shape.Salt, seqs.Add(1))
			msg.BusinessKey, msg.EventID, bizID = key, keyedEventID(benchEventType, key), key
		}
		res, err := p.Send(ctx, msg, func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, insert, bizID, int64(len(payload)), payload)
			return err
		})
		if err != nil {
			return err
		}
		if res.State != txproducer.StateCommitted || res.Duplicate {
			return fmt.Errorf("send state %s (duplicate %v)", res.State, res.Duplicate)
		}
		sent.add(res.EventID, wire.Hash(payload))
		return nil
	}

	// First delivery and cold duplicate.
	cbiz := pe.Names.Name("orders_scalec")
	if err := pe.businessTable(ctx, cbiz); err != nil {
		return sides, err
	}
	cinsert := pe.insertOrderSQL(cbiz)
	handler := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		_, err := tx.ExecContext(ctx, cinsert, ev.ID, int64(len(ev.Payload)), ev.Payload)
		return err
	}
	routes := map[string]consumer.Route{benchEventType: {Handler: handler}}
	first, err := consumer.NewProcessor(consumer.ProcessorConfig{Group: shape.CGroup, DB: pe.DB, TablePrefix: prefix, VersionMode: consumer.VersionNone, Routes: routes})
	if err != nil {
		return sides, err
	}
	cold, err := consumer.NewProcessor(consumer.ProcessorConfig{Group: shape.CGroup, DB: pe.DB, TablePrefix: prefix, VersionMode: consumer.VersionNone, Routes: routes, DedupCacheSize: -1})
	if err != nil {
		return sides, err
	}
	fd := add(scaleFirst, "msgs/s", "consumer.Processor.Process of a new event on the preloaded consume log: BEGIN; dedup INSERT; business INSERT; COMMIT (no broker)", o.Concurrency, dbWarm)
	var cseq atomic.Int64
	fd.op = func(ctx context.Context, _ int, _ int64) error {
		n := cseq.Add(1)
		id := wire.NewEventID()
		if hashed {
			id = keyedEventID(benchEventType+".consumed", fmt.Sprintf("c-%s-%d", shape.Salt, n))
		}
		if out := first.Process(ctx, consumerMessage(id, makePayload(o.Payload, n))); out.Result != consumer.ResultApplied {
			return fmt.Errorf("first delivery: outcome %s (%v)", out.Result, out.Err)
		}
		applied.add(id, strconv.FormatInt(n, 10))
		return nil
	}
	dup := add(scaleDup, "msgs/s", "consumer.Processor (dedup cache off: a new instance) redelivering an applied event: dedup hit decided by the database, handler not run", o.Concurrency, dbWarm)
	dup.op = func(ctx context.Context, _ int, _ int64) error {
		var m consumer.Message
		if shape.Rows > 0 {
			seq := 1 + rand.Int64N(shape.TailFrom-1)
			m = consumerMessage(shape.eventID(seq), shape.payload(seq))
		} else {
			id, aux, ok := applied.pick()
			if !ok {
				return errors.New("cold duplicate: nothing applied yet")
			}
			n, _ := strconv.ParseInt(aux, 10, 64)
			m = consumerMessage(id, makePayload(o.Payload, n))
		}
		if out := cold.Process(ctx, m); out.Result != consumer.ResultDuplicate {
			return fmt.Errorf("cold duplicate of %s: outcome %s (%v)", m.Properties[wire.PropEventID], out.Result, out.Err)
		}
		return nil
	}
	if shape.Rows > 0 && shape.TailFrom <= 1 {
		dup.side.Skipped = "no applied rows preloaded"
	}

	// Check-back point read.
	chk, err := checkback.New(checkback.Config{Log: store, Group: shape.Group})
	if err != nil {
		return sides, err
	}
	cb := add(scaleCheck, "checks/s", "checkback.Checker.CheckQuery of a committed event id: txlog point read by primary key, answered COMMIT from the row; one at a time, as the client answers checks", 1, dbWarm)
	cb.op = func(ctx context.Context, _ int, _ int64) error {
		var id, hash string
		if shape.Rows > 0 {
			seq := oldCommitted()
			id, hash = shape.eventID(seq), shape.payloadHash(seq)
		} else {
			var ok bool
			if id, hash, ok = sent.pick(); !ok {
				return errors.New("check-back: nothing sent yet")
			}
		}
		a := chk.CheckQuery(ctx, checkback.Query{EventID: id, Group: shape.Group, Topic: topic, EventType: benchEventType, PayloadHash: hash})
		if a.Decision != checkback.Commit || a.Reason != checkback.ReasonFound {
			return fmt.Errorf("check-back of %s: %s (%s, %v)", id, a.Decision, a.Reason, a.Err)
		}
		return nil
	}

	// The same for ids this point's Send rounds committed: a real check
	// asks about a half sent seconds or minutes ago, whose row is cached.
	cbr := add(scaleCheckRecent, "checks/s", "checkback.Checker.CheckQuery of an event id the Send rounds of this point committed (a real check asks about a recent half); otherwise as check-back read", 1, dbWarm)
	cbr.op = func(ctx context.Context, _ int, _ int64) error {
		id, hash, ok := sent.pick()
		if !ok {
			return errors.New("check-back: nothing sent yet")
		}
		a := chk.CheckQuery(ctx, checkback.Query{EventID: id, Group: shape.Group, Topic: topic, EventType: benchEventType, PayloadHash: hash})
		if a.Decision != checkback.Commit || a.Reason != checkback.ReasonFound {
			return fmt.Errorf("check-back of %s: %s (%s, %v)", id, a.Decision, a.Reason, a.Err)
		}
		return nil
	}

	// Outbox claim.
	claim := add(scaleClaim, "msgs/s", fmt.Sprintf("outbox.Dispatcher (Concurrency %d, no-op sink) draining %d PENDING rows enqueued next to the preloaded ones: claim, sink, SENT", o.Concurrency, scaleClaimRows), o.Concurrency, 0)
	var obSeq atomic.Int64
	claim.round = func(ctx context.Context, index, rows int, pr *serverProbe) (Round, error) {
		evs := make([]outbox.Event, rows)
		for i := range evs {
			n := obSeq.Add(1)
			evs[i] = outbox.Event{EventType: benchEventType, Destination: topic, Payload: makePayload(o.Payload, n)}
			if hashed {
				key := fmt.Sprintf("ob-%s-%d", shape.Salt, n)
				evs[i].MessageKey, evs[i].EventID = key, keyedEventID(benchEventType+".outbox", key)
			}
		}
		return scaleClaimRound(ctx, pe, prefix, obTable, index, evs, pr)
	}

	// Operator tooling.
	in, err := inspect.New(inspect.Config{DB: pe.DB, TablePrefix: prefix})
	if err != nil {
		return sides, err
	}
	st := add(scaleStuck, "calls/s", "inspect.Inspector.Stuck(older than 1m, limit 100): what `rmqtx stuck` runs", 1, dbWarm)
	st.op = func(ctx context.Context, _ int, _ int64) error {
		_, _, err := in.Stuck(ctx, time.Minute, 100)
		return err
	}
	ins := add(scaleInspect, "calls/s", "inspect.Inspector.Event of an event id (txlog, outbox, consume log, attempts, dead letters, replays): what `rmqtx inspect ID --no-broker` runs", 1, dbWarm)
	ins.op = func(ctx context.Context, _ int, _ int64) error {
		var id string
		if shape.Rows > 0 {
			id = shape.eventID(1 + rand.Int64N(shape.Rows))
		} else {
			var ok bool
			if id, _, ok = sent.pick(); !ok {
				return errors.New("inspect: nothing sent yet")
			}
		}
		v, err := in.Event(ctx, id)
		if err != nil {
			return err
		}
		if !v.Found() {
			return fmt.Errorf("inspect %s: not found", id)
		}
		return nil
	}
	return sides, nil
}

// scaleMeasureRounds warms every side up, then runs the rounds, the sides
// in a fixed order (Send and first delivery fill what the reads at size 0
// look up).
func scaleMeasureRounds(ctx context.Context, pe *Env, sides []*scaleSide, w *Workload, pr *serverProbe) error {
	o := pe.Opt
	claimRows := min(scaleClaimRows, o.OutboxRows)
	for _, s := range sides {
		if s.side.Skipped != "" {
			continue
		}
		switch {
		case s.op != nil && s.warm > 0:
			res := RunLoop(ctx, s.conc, s.warm, 0, s.op)
			if res.Count == 0 && res.FirstErr != nil {
				return fmt.Errorf("%s warm-up: %w", s.side.Name, res.FirstErr)
			}
		case s.round != nil:
			if _, err := s.round(ctx, 0, max(1, claimRows/4), nil); err != nil {
				return fmt.Errorf("%s warm-up: %w", s.side.Name, err)
			}
		}
	}
	for r := 0; r < o.Rounds && ctx.Err() == nil; r++ {
		for _, s := range sides {
			if s.side.Skipped != "" {
				continue
			}
			var ro Round
			if s.op != nil {
				snap := pr.begin(ctx)
				res := RunLoop(ctx, s.conc, o.Duration, o.N, s.op)
				ro = res.Round(r + 1)
				pr.end(ctx, snap, &ro)
				if res.FirstErr != nil {
					w.Notes = append(w.Notes, fmt.Sprintf("%s round %d: %d errors, first: %v", s.side.Name, r+1, res.Errors, res.FirstErr))
				}
			} else {
				var err error
				if ro, err = s.round(ctx, r+1, claimRows, pr); err != nil {
					return fmt.Errorf("%s round %d: %w", s.side.Name, r+1, err)
				}
			}
			s.side.Rounds = append(s.side.Rounds, ro)
			pe.Log("  round %d %-36s %9.1f %s p50 %.2fms p99 %.2fms errors %d", r+1, s.side.Name, ro.Rate, s.side.Unit, ro.P50Ms, ro.P99Ms, ro.Errors)
		}
	}
	return nil
}

// scaleClaimRound enqueues evs and times a dispatcher with a no-op sink
// until every one is SENT; the claim histogram gives the claim time.
func scaleClaimRound(ctx context.Context, pe *Env, prefix string, table outbox.Table, index int, evs []outbox.Event, pr *serverProbe) (Round, error) {
	if err := enqueueAll(ctx, pe.DB, table, evs); err != nil {
		return Round{}, err
	}
	var (
		sent, other atomic.Int64
		done        = make(chan struct{})
		once        sync.Once
		want        = int64(len(evs))
	)
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		return Round{}, err
	}
	d, err := outbox.NewDispatcher(outbox.Config{
		DB: pe.DB, TablePrefix: prefix, Concurrency: pe.Opt.Concurrency, Name: "scale-" + randHex(4),
		Sink: outbox.FuncSink(func(context.Context, *outbox.Message) error { return nil }),
		OnOutcome: func(oc outbox.Outcome) {
			if oc.Status != outbox.StatusSent {
				other.Add(1)
				return
			}
			if sent.Add(1) == want {
				once.Do(func() { close(done) })
			}
		},
		Observe: observe.Observe{Metrics: m},
	})
	if err != nil {
		return Round{}, err
	}
	snap := pr.begin(ctx) // after the enqueue: the probe counts the drain only
	t0 := time.Now()
	if err := d.Start(ctx); err != nil {
		return Round{}, err
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = d.Shutdown(sctx)
	}()
	timer := time.NewTimer(pe.Opt.Timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		return Round{}, fmt.Errorf("%d of %d rows SENT after %s (%d other outcomes)", sent.Load(), want, pe.Opt.Timeout, other.Load())
	case <-ctx.Done():
		return Round{}, ctx.Err()
	}
	el := time.Since(t0)
	r := Round{Index: index, Count: want, Errors: other.Load(), Seconds: el.Seconds(), Rate: float64(want) / el.Seconds()}
	pr.end(ctx, snap, &r)
	if claims, sum, ok := claimHistogram(reg); ok && claims > 0 {
		if r.Extra == nil {
			r.Extra = map[string]float64{}
		}
		r.Extra["claims"], r.Extra["mean_claim_ms"], r.Extra["rows_per_claim"] = float64(claims), sum*1000/float64(claims), float64(want)/float64(claims)
	}
	return r, nil
}

// scaleArchiveRounds runs -rounds pairs of Send rounds: one with nothing
// else running, one with the archiver removing the txlog's rows past
// retention at the same time.
func scaleArchiveRounds(ctx context.Context, pe *Env, pt *ScalePoint, send *scaleSide, w *Workload, pr *serverProbe) ([]*Side, error) {
	o := pe.Opt
	label := scaleLabel(pt.DB, pt.IDs, pt.Rows)
	plain := &Side{Name: label + " " + scaleSendPlain, Unit: "tx/s", Description: "Send round of an archival pair, nothing else running"}
	with := &Side{Name: label + " " + scaleSendArch, Unit: "tx/s", Description: "Send round with archive.Archiver.Run on the txlog at the same time"}
	arch := &Side{Name: label + " " + scaleArchival, Unit: "rows/s", Description: fmt.Sprintf("archive.Archiver.Run (Tables txlog, retention %s, batch 500, delete) during a Send round: rows removed / time until none was left or the round ended", archive.DefaultTxlogRetention)}
	withPaced := &Side{Name: label + " " + scaleSendPaced, Unit: "tx/s", Description: fmt.Sprintf("Send round with archive.Archiver.Run on the txlog paced at %.0fx the rate of the round without (Config.RowsPerSecond)", targetArchiveKeepUp)}
	archPaced := &Side{Name: label + " " + scaleArchivalPaced, Unit: "rows/s", Description: "the paced archiver's rows removed / time"}
	out := []*Side{plain, with, arch, withPaced, archPaced}
	a, err := archive.New(archive.Config{DB: pe.DB, TablePrefix: sqlname.DefaultPrefix, Tables: []archive.Table{archive.Txlog}})
	if err != nil {
		return out, err
	}
	plan, err := a.Plan(ctx)
	if err != nil {
		return out, err
	}
	res := &ScaleArchive{}
	for _, r := range plan.Rules {
		res.Eligible += r.Eligible
	}
	var keep, rise, risePaced []float64
	for r := 0; r < o.Rounds && ctx.Err() == nil; r++ {
		snap := pr.begin(ctx)
		p := RunLoop(ctx, send.conc, o.Duration, o.N, send.op).Round(r + 1)
		pr.end(ctx, snap, &p)
		plain.Rounds = append(plain.Rounds, p)

		wr, ar, runErr := scaleArchiveRound(ctx, a, send, o, r, pr)
		if runErr != nil && !errors.Is(runErr, context.Canceled) {
			return out, fmt.Errorf("archive: %w", runErr)
		}
		with.Rounds = append(with.Rounds, wr)
		arch.Rounds = append(arch.Rounds, ar)
		removed := ar.Count
		res.Removed += removed

		// The same, paced at the target: what keeping up at 5x costs.
		pacedAt := targetArchiveKeepUp * p.Rate
		ap, err := archive.New(archive.Config{DB: pe.DB, TablePrefix: sqlname.DefaultPrefix, Tables: []archive.Table{archive.Txlog}, RowsPerSecond: pacedAt})
		if err != nil {
			return out, err
		}
		pw, apr, perr := scaleArchiveRound(ctx, ap, send, o, r, pr)
		if perr != nil && !errors.Is(perr, context.Canceled) {
			return out, fmt.Errorf("archive paced: %w", perr)
		}
		withPaced.Rounds = append(withPaced.Rounds, pw)
		archPaced.Rounds = append(archPaced.Rounds, apr)
		premoved := apr.Count
		res.Removed += premoved
		pe.Log("  round %d %-36s %9.1f tx/s p99 %.2fms | with archival %9.1f tx/s p99 %.2fms, archived %d rows in %.2fs = %.0f rows/s | paced at %.0f rows/s: %9.1f tx/s p99 %.2fms, archived %.0f rows/s",
			r+1, label+" Send", p.Rate, p.P99Ms, wr.Rate, wr.P99Ms, removed, ar.Seconds, ar.Rate, pacedAt, pw.Rate, pw.P99Ms, apr.Rate)
		if removed > 0 && wr.Rate > 0 {
			keep = append(keep, ar.Rate/wr.Rate)
		}
		if removed > 0 && p.P99Ms > 0 && wr.P99Ms > 0 {
			rise = append(rise, wr.P99Ms/p.P99Ms)
		}
		if premoved > 0 && p.P99Ms > 0 && pw.P99Ms > 0 {
			risePaced = append(risePaced, pw.P99Ms/p.P99Ms)
		}
		if res.DrainedInRound == 0 && (runErr == nil || perr == nil) {
			res.DrainedInRound = r + 1
		}
	}
	for _, s := range out {
		s.Summarize()
	}
	var rates []float64
	for _, ro := range arch.Rounds {
		if ro.Count > 0 {
			rates = append(rates, ro.Rate)
		}
	}
	if len(rates) > 0 {
		res.RowsPerSec = Median(rates)
	}
	res.SendRate, res.SendRateWith, res.SendP99Ms, res.SendP99MsWith = plain.Rate, with.Rate, plain.P99Ms, with.P99Ms
	if len(keep) > 0 {
		rk := scaleRatio(label+" archived rows/s / Send tx/s", arch.Name, with.Name, keep, targetArchiveKeepUp)
		w.Ratios = append(w.Ratios, rk)
		res.KeepUp, res.KeepUpMet = rk.Value, rk.Met
	}
	if len(rise) > 0 {
		w.Ratios = append(w.Ratios, scaleRatio(label+" Send p99 without / with archival unpaced", plain.Name, with.Name, inverses(rise), 0))
		res.P99Rise = Median(rise)
	}
	if len(risePaced) > 0 {
		rp := scaleRatio(label+" Send p99 without / with archival paced at 5x", plain.Name, withPaced.Name, inverses(risePaced), 1/targetArchiveP99Rise)
		w.Ratios = append(w.Ratios, rp)
		res.P99RisePaced = Median(risePaced)
		res.P99Met = rp.Met
		res.SendP99MsPaced = withPaced.P99Ms
		res.PacedRowsPerSec = archPaced.Rate
	}
	pt.Archive = res
	w.Notes = append(w.Notes, scaleArchiveNote(label, res))
	if probes := probeNotes([]*Side{plain, with, withPaced}, label+" "); len(probes) > 0 {
		w.Notes = append(w.Notes, label+" archival rounds, per Send (the archiver's work included; medians of rounds): "+strings.Join(probes, "; "))
	}
	return out, nil
}

// scaleArchiveRound runs one Send round with a's Run going on at the same
// time, stopped when the round ends. It returns the Send round, the
// archival round (rows removed, how long Run ran, rows/s), and Run's error
// (nil: it finished, nothing was left).
func scaleArchiveRound(ctx context.Context, a *archive.Archiver, send *scaleSide, o Options, r int, pr *serverProbe) (Round, Round, error) {
	actx, stop := context.WithCancel(ctx)
	var (
		rep     archive.Report
		runErr  error
		elapsed time.Duration
		done    = make(chan struct{})
	)
	snap := pr.begin(ctx)
	go func() {
		defer close(done)
		t0 := time.Now()
		rep, runErr = a.Run(actx)
		elapsed = time.Since(t0)
	}()
	wr := RunLoop(ctx, send.conc, o.Duration, o.N, send.op).Round(r + 1)
	stop()
	<-done
	pr.end(ctx, snap, &wr)
	ar := Round{Index: r + 1, Count: rep.Removed(), Seconds: elapsed.Seconds()}
	if elapsed > 0 {
		ar.Rate = float64(ar.Count) / elapsed.Seconds()
	}
	return wr, ar, runErr
}

// inverses returns 1/x for each x (a "with / without" ratio printed as
// "without / with", so that its target reads as at least).
func inverses(xs []float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = 1 / x
	}
	return out
}

// scaleRatio is a Ratio from per-round values computed by the caller.
func scaleRatio(name, num, den string, rounds []float64, target float64) Ratio {
	r := Ratio{Name: name, Numerator: num, Denominator: den, Rounds: rounds, Value: Median(rounds)}
	if target > 0 {
		t := target
		r.Target = &t
		if !math.IsNaN(r.Value) {
			met := r.Value >= target
			r.Met = &met
		}
	}
	return r
}

func verdict(met *bool) string {
	switch {
	case met == nil:
		return "no value"
	case *met:
		return "target met"
	default:
		return "target missed"
	}
}

func scaleArchiveNote(label string, a *ScaleArchive) string {
	drained := "rows left after the last round"
	if a.DrainedInRound > 0 {
		drained = fmt.Sprintf("nothing eligible left during round %d; rounds that removed nothing are not in the rate", a.DrainedInRound)
	}
	return fmt.Sprintf("archival %s: %d of %d eligible txlog rows removed, %.0f rows/s unpaced (%s); keeps up %.1fx Send's write rate (>= %.0fx: %s); Send p99 %.2fms without, %.2fms with unpaced archival (%.2fx), %.2fms with archival paced at %.0fx (%.0f rows/s) = %.2fx (<= %.2fx: %s); Send %.0f tx/s without, %.0f with unpaced",
		label, a.Removed, a.Eligible, a.RowsPerSec, drained, a.KeepUp, targetArchiveKeepUp, verdict(a.KeepUpMet),
		a.SendP99Ms, a.SendP99MsWith, a.P99Rise, a.SendP99MsPaced, targetArchiveKeepUp, a.PacedRowsPerSec, a.P99RisePaced, targetArchiveP99Rise, verdict(a.P99Met), a.SendRate, a.SendRateWith)
}

// scaleRequested reports whether the scale workload is among ws.
func scaleRequested(ws []string) bool { return slices.Contains(ws, "scale") }
