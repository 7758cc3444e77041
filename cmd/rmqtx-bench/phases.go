package main

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/rmqtx/rmqtx/internal/otelx"
)

// Issue 25 item 5 (tail latency): what makes a Send slow. With -phases the
// raw tx sides and the side "rmqtx Send + phase spans" record, per Send, how
// long each phase took; every round reports each phase's p50 and p99 and,
// over the Sends slower than the round's p99, the mean share of each phase
// in the Send. Pool waits and answered check-backs are counted per round on
// every side, with or without -phases.

// Phases of one transactional Send. The first three add up to the Send; the
// last three split the local phase.
const (
	phHalf        = iota // the half message: SendMessageInTransaction until the local transaction starts
	phLocal              // the local transaction callback
	phEnd                // from the callback's return until the Send returns (END_TRANSACTION, bookkeeping)
	phLocalPre           // raw: BEGIN (+ log INSERT); rmqtx: waiting for the early BEGIN + txlog INSERT
	phLocalFn            // the business INSERT
	phLocalCommit        // COMMIT (rmqtx: until the local-transaction span ends)
	phEndSetup           // part of end: rmqtx Send's set-up before the half's span starts (raw: 0)
	nPhases
)

var phaseNames = [nPhases]string{"half", "local", "end", "local_pre", "local_fn", "local_commit", "end_setup"}

// phaseSample is one committed Send: its total and its phases.
type phaseSample struct {
	total time.Duration
	ph    [nPhases]time.Duration
}

// PhaseStat is one phase over one round.
type PhaseStat struct {
	Name string
	P50  time.Duration
	P99  time.Duration
	// TailShare is the mean, over the Sends slower than the round's p99
	// (of the samples' totals), of phase / total; NaN with no such Send.
	TailShare float64
}

// PhaseSummary is the breakdown of one round.
type PhaseSummary struct {
	Samples int
	Tail    int           // Sends slower than P99
	P99     time.Duration // p99 of the samples' totals
	Phases  [nPhases]PhaseStat
}

// SummarizePhases computes the per-phase percentiles (nearest rank) and the
// mean phase shares of the Sends whose total exceeds the p99 of totals.
func SummarizePhases(samples []phaseSample) PhaseSummary {
	s := PhaseSummary{Samples: len(samples)}
	for i := range s.Phases {
		s.Phases[i] = PhaseStat{Name: phaseNames[i], TailShare: math.NaN()}
	}
	if len(samples) == 0 {
		return s
	}
	totals := make([]time.Duration, len(samples))
	for i, x := range samples {
		totals[i] = x.total
	}
	slices.Sort(totals)
	s.P99 = Percentile(totals, 99)
	var sums [nPhases]float64
	for _, x := range samples {
		if x.total <= s.P99 || x.total <= 0 {
			continue
		}
		s.Tail++
		for i, d := range x.ph {
			sums[i] += float64(d) / float64(x.total)
		}
	}
	col := make([]time.Duration, len(samples))
	for i := range s.Phases {
		for j, x := range samples {
			col[j] = x.ph[i]
		}
		slices.Sort(col)
		s.Phases[i].P50 = Percentile(col, 50)
		s.Phases[i].P99 = Percentile(col, 99)
		if s.Tail > 0 {
			s.Phases[i].TailShare = sums[i] / float64(s.Tail)
		}
	}
	return s
}

// Extras writes the summary into a round's extras: phase_<name>_p50_ms,
// phase_<name>_p99_ms, phase_<name>_tail_share, phase_samples, phase_tail.
func (s PhaseSummary) Extras(m map[string]float64) {
	if s.Samples == 0 {
		return
	}
	m["phase_samples"] = float64(s.Samples)
	m["phase_tail"] = float64(s.Tail)
	for _, p := range s.Phases {
		m["phase_"+p.Name+"_p50_ms"] = ms(p.P50)
		m["phase_"+p.Name+"_p99_ms"] = ms(p.P99)
		if !math.IsNaN(p.TailShare) {
			m["phase_"+p.Name+"_tail_share"] = p.TailShare
		}
	}
}

// String is the round's breakdown in one line.
func (s PhaseSummary) String() string {
	if s.Samples == 0 {
		return "no phase samples"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "p50/p99 ")
	for i, p := range s.Phases {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %.2f/%.2f", p.Name, ms(p.P50), ms(p.P99))
	}
	fmt.Fprintf(&b, " ms; tail (%d Sends > p99 %.2fms) shares ", s.Tail, ms(s.P99))
	for i, p := range s.Phases {
		if i > 0 {
			b.WriteString(" ")
		}
		if math.IsNaN(p.TailShare) {
			fmt.Fprintf(&b, "%s -", p.Name)
		} else {
			fmt.Fprintf(&b, "%s %.0f%%", p.Name, 100*p.TailShare)
		}
	}
	return b.String()
}

// phaseLog collects the samples of one side, one slice per worker (RunLoop's
// worker index), so the hot path appends without a lock. take is called
// between runs, when no worker is running.
type phaseLog struct{ per [][]phaseSample }

func newPhaseLog(workers int) *phaseLog {
	l := &phaseLog{per: make([][]phaseSample, workers)}
	for i := range l.per {
		l.per[i] = make([]phaseSample, 0, 4096)
	}
	return l
}

func (l *phaseLog) add(w int, s phaseSample) {
	if w >= 0 && w < len(l.per) {
		l.per[w] = append(l.per[w], s)
	}
}

// take returns the samples since the last take and starts over.
func (l *phaseLog) take() []phaseSample {
	var out []phaseSample
	for i := range l.per {
		out = append(out, l.per[i]...)
		l.per[i] = l.per[i][:0]
	}
	return out
}

// rawRec is a raw Send in flight: the op sets msg before
// SendMessageInTransaction; the listener, which the client calls on the
// same goroutine with the same *Message, finds the record by pointer and
// stamps the local transaction's times.
type rawRec struct {
	msg                     atomic.Pointer[primitive.Message]
	local0, pre, fn, commit time.Time
	stamped                 bool
}

// rawRecs is one record per worker.
type rawRecs []rawRec

// rawRecsFor returns the raw sides' records: none unless -phases, so that
// by default the raw sides run exactly what a user would write.
func rawRecsFor(o Options) rawRecs {
	if !o.Phases {
		return nil
	}
	return make(rawRecs, o.Concurrency)
}

func (r rawRecs) find(m *primitive.Message) *rawRec {
	for i := range r {
		if r[i].msg.Load() == m {
			return &r[i]
		}
	}
	return nil
}

// sample turns a stamped record and the Send's start and end into a sample.
func (r *rawRec) sample(t0, t3 time.Time) (phaseSample, bool) {
	if !r.stamped {
		return phaseSample{}, false
	}
	var s phaseSample
	s.total = t3.Sub(t0)
	s.ph[phHalf] = r.local0.Sub(t0)
	s.ph[phLocal] = r.commit.Sub(r.local0)
	s.ph[phEnd] = t3.Sub(r.commit)
	s.ph[phLocalPre] = r.pre.Sub(r.local0)
	s.ph[phLocalFn] = r.fn.Sub(r.pre)
	s.ph[phLocalCommit] = r.commit.Sub(r.fn)
	return s, true
}

// spanRec is an rmqtx Send in flight: the bench puts it in the context it
// passes to Send; the recorder's OnStart finds it in the parent context of
// the Send's spans and keeps them; fn stamps its start and end.
type spanRec struct {
	send, half, local sdktrace.ReadOnlySpan
	fn0, fn1          time.Time
}

type spanRecKey struct{}

// spanRecorder is an OpenTelemetry SpanProcessor that keeps nothing but
// the spans of the Send whose record is in the parent context (checks are
// counted by txproducer's OnCheck, not here).
type spanRecorder struct{}

func (r *spanRecorder) OnStart(parent context.Context, s sdktrace.ReadWriteSpan) {
	rec, _ := parent.Value(spanRecKey{}).(*spanRec)
	if rec == nil {
		return
	}
	switch s.Name() {
	case otelx.SpanSend:
		rec.send = s
	case otelx.SpanHalfSend:
		rec.half = s
	case otelx.SpanLocalTx:
		rec.local = s
	}
}

func (r *spanRecorder) OnEnd(sdktrace.ReadOnlySpan)      {}
func (r *spanRecorder) Shutdown(context.Context) error   { return nil }
func (r *spanRecorder) ForceFlush(context.Context) error { return nil }
func spanDur(s sdktrace.ReadOnlySpan) time.Duration      { return s.EndTime().Sub(s.StartTime()) }
func (rec *spanRec) reset()                              { *rec = spanRec{} }
func withSpanRec(ctx context.Context, rec *spanRec) context.Context {
	return context.WithValue(ctx, spanRecKey{}, rec)
}

// sample is the Send's breakdown from its spans: end = send - half - local
// (clamped at 0); local_pre = the local span's start until fn starts (the
// early BEGIN + txlog INSERT not yet done when the half was stored).
func (rec *spanRec) sample() (phaseSample, bool) {
	if rec.send == nil || rec.half == nil || rec.local == nil || rec.fn0.IsZero() || rec.fn1.IsZero() {
		return phaseSample{}, false
	}
	var s phaseSample
	s.total = spanDur(rec.send)
	s.ph[phHalf] = spanDur(rec.half)
	s.ph[phLocal] = spanDur(rec.local)
	s.ph[phEnd] = max(0, s.total-s.ph[phHalf]-s.ph[phLocal])
	s.ph[phLocalPre] = max(0, rec.fn0.Sub(rec.local.StartTime()))
	s.ph[phLocalFn] = rec.fn1.Sub(rec.fn0)
	s.ph[phLocalCommit] = max(0, rec.local.EndTime().Sub(rec.fn1))
	s.ph[phEndSetup] = min(s.ph[phEnd], max(0, rec.half.StartTime().Sub(rec.send.StartTime())))
	return s, true
}

// roundProbe is what a side measures around each round besides the loop:
// the pool's waits, the checks its producer answered, its phase samples.
type roundProbe struct {
	db         *sql.DB
	checks     func() int64 // answered checks so far (nil: none)
	phases     *phaseLog    // nil: no breakdown on this side
	recoveries func() int64 // discard recoveries so far (rmqtx), or nil

	st0         sql.DBStats
	checks0     int64
	recoveries0 int64
}

func (p *roundProbe) begin() {
	if p == nil {
		return
	}
	if p.db != nil {
		p.st0 = p.db.Stats()
	}
	if p.checks != nil {
		p.checks0 = p.checks()
	}
	if p.recoveries != nil {
		p.recoveries0 = p.recoveries()
	}
	if p.phases != nil {
		p.phases.take() // drop the warm-up's and earlier rounds' leftovers
	}
}

// finish adds the round's figures to its extras and returns the phase
// summary (zero without a breakdown).
func (p *roundProbe) finish(r *Round) PhaseSummary {
	if p == nil {
		return PhaseSummary{}
	}
	if r.Extra == nil {
		r.Extra = map[string]float64{}
	}
	if p.db != nil {
		st := p.db.Stats()
		r.Extra["pool_wait_count"] = float64(st.WaitCount - p.st0.WaitCount)
		r.Extra["pool_wait_ms"] = ms(st.WaitDuration - p.st0.WaitDuration)
		r.Extra["pool_open_at_end"] = float64(st.OpenConnections)
	}
	if p.checks != nil {
		r.Extra["checks"] = float64(p.checks() - p.checks0)
	}
	if p.recoveries != nil {
		r.Extra["recoveries"] = float64(p.recoveries() - p.recoveries0)
	}
	if p.phases == nil {
		return PhaseSummary{}
	}
	s := SummarizePhases(p.phases.take())
	s.Extras(r.Extra)
	return s
}

// medianExtra is the median over the rounds of one extra (NaN when no round
// has it).
func medianExtra(rounds []Round, key string) float64 {
	var xs []float64
	for _, r := range rounds {
		if v, ok := r.Extra[key]; ok {
			xs = append(xs, v)
		}
	}
	return Median(xs)
}

// phaseNotes are the table notes of the breakdown: per side, the medians
// over the rounds of each phase's p50/p99 and tail share, the rounds' tail
// shares of half/local/end, and every side's pool waits and checks per round.
func phaseNotes(w *Workload, phasesOn bool) []string {
	var out []string
	for _, s := range w.Sides {
		if len(s.Rounds) == 0 || math.IsNaN(medianExtra(s.Rounds, "phase_samples")) {
			continue
		}
		var pp, sh []string
		for _, n := range phaseNames {
			pp = append(pp, fmt.Sprintf("%s %.2f/%.2f", n, medianExtra(s.Rounds, "phase_"+n+"_p50_ms"), medianExtra(s.Rounds, "phase_"+n+"_p99_ms")))
			sh = append(sh, fmt.Sprintf("%s %s", n, fmtShare(medianExtra(s.Rounds, "phase_"+n+"_tail_share"))))
		}
		var per []string
		for _, r := range s.Rounds {
			per = append(per, fmt.Sprintf("%s/%s/%s", fmtShare(extraOrNaN(r, "phase_half_tail_share")),
				fmtShare(extraOrNaN(r, "phase_local_tail_share")), fmtShare(extraOrNaN(r, "phase_end_tail_share"))))
		}
		out = append(out, fmt.Sprintf("phases %s, p50/p99 ms (medians of rounds): %s; Sends > the round's p99, mean share: %s; rounds' half/local/end shares: %s",
			s.Name, strings.Join(pp, ", "), strings.Join(sh, " "), strings.Join(per, " ")))
	}
	var pool, checks []string
	for _, s := range w.Sides {
		var pw, ck []string
		for _, r := range s.Rounds {
			if v, ok := r.Extra["pool_wait_count"]; ok {
				pw = append(pw, fmt.Sprintf("%.0f/%.1fms", v, r.Extra["pool_wait_ms"]))
			}
			if v, ok := r.Extra["checks"]; ok {
				c := fmt.Sprintf("%.0f", v)
				if rv, ok := r.Extra["recoveries"]; ok && rv > 0 {
					c += fmt.Sprintf("(+%.0f recoveries)", rv)
				}
				ck = append(ck, c)
			}
		}
		if len(pw) > 0 {
			pool = append(pool, s.Name+": "+strings.Join(pw, " "))
		}
		if len(ck) > 0 {
			checks = append(checks, s.Name+": "+strings.Join(ck, " "))
		}
	}
	if len(pool) > 0 {
		out = append(out, "pool waits per round (db.Stats WaitCount/WaitDuration deltas; every side uses the one *sql.DB of the run, sides run one at a time, so a round's waits are its side's plus any background work of the idle producers: checks, discard recovery): "+strings.Join(pool, "; "))
	}
	if len(checks) > 0 {
		out = append(out, "check-backs answered per round (raw: calls of the bench's CheckLocalTransaction; rmqtx: txproducer OnCheck): "+strings.Join(checks, "; "))
	}
	if len(out) > 0 {
		note := "phases: half = SendMessageInTransaction until the local transaction starts, local = the local transaction (local_pre: raw BEGIN (+ log INSERT); rmqtx the wait for its early BEGIN + txlog INSERT, which overlap the half and run on their own goroutine; local_fn: the business INSERT; local_commit: COMMIT), end = the callback's return until the Send returns (END_TRANSACTION; rmqtx: send span - half - local, clamped at 0, which also holds Send's set-up before the half: end_setup, the send span's start until the half span's, 0 on raw sides); with -phases the raw sides are timed in the bench's listener, rmqtx from its spans"
		if phasesOn {
			note += "; the rmqtx breakdown is of the side \"" + sideRmqtxPhases + "\" (every span sampled and kept in memory), next to the plain rmqtx Send (see its ratio)"
		} else {
			note += "; rmqtx sides have no breakdown unless -phases adds the side \"" + sideRmqtxPhases + "\" (recording spans costs like -tracing, so it is off by default)"
		}
		out = append(out, note)
	}
	return out
}

func extraOrNaN(r Round, key string) float64 {
	if v, ok := r.Extra[key]; ok {
		return v
	}
	return math.NaN()
}

func fmtShare(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*x)
}
