package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// Percentile returns the p-th percentile (0 < p <= 100) of sorted, by the
// nearest-rank method: the smallest value such that at least p% of the
// values are less than or equal to it. It returns 0 for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	if rank < 1 {
		rank = 1
	}
	if rank > n {
		rank = n
	}
	return sorted[rank-1]
}

// Median returns the median of xs (the mean of the two middle values for an
// even count), or NaN for an empty slice. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// Round is one measured round of one side.
type Round struct {
	Index   int     `json:"index"`
	Count   int64   `json:"count"`            // operations or messages completed
	Errors  int64   `json:"errors,omitempty"` // failed operations (not counted in Rate)
	Seconds float64 `json:"seconds"`          // measured window
	Rate    float64 `json:"rate"`             // Count / Seconds
	P50Ms   float64 `json:"p50_ms,omitempty"` // per-operation latency, when measured
	P99Ms   float64 `json:"p99_ms,omitempty"`
	P999Ms  float64 `json:"p999_ms,omitempty"` // the 99.9th percentile
	// Extra carries workload-specific figures (e.g. wall time including
	// start-up) for the JSON only.
	Extra map[string]float64 `json:"extra,omitempty"`
}

// Side is one way of running a workload (raw client, rmqtx, ...).
type Side struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Unit        string  `json:"unit"` // "tx/s", "msgs/s", "checks/s"
	Rounds      []Round `json:"rounds"`
	// Medians over the rounds.
	Rate    float64 `json:"rate"`
	P50Ms   float64 `json:"p50_ms,omitempty"`
	P99Ms   float64 `json:"p99_ms,omitempty"`
	P999Ms  float64 `json:"p999_ms,omitempty"`
	Seconds float64 `json:"seconds"`
	Errors  int64   `json:"errors"` // summed over the rounds
	// Skipped says why the side did not run (e.g. a package not built yet).
	Skipped string `json:"skipped,omitempty"`
	// CPUSplit is the CPU per operation by part (-cpu-split, cpusplit.go).
	CPUSplit *CPUSplit `json:"cpu_split,omitempty"`
	// Paced is the cap on the side's operations a second (-rate; 0: none).
	Paced float64 `json:"paced_per_second,omitempty"`
}

// Summarize fills the side's medians from its rounds.
func (s *Side) Summarize() {
	if len(s.Rounds) == 0 {
		return
	}
	var rates, p50, p99, p999, secs []float64
	s.Errors = 0
	for _, r := range s.Rounds {
		rates = append(rates, r.Rate)
		secs = append(secs, r.Seconds)
		if r.P50Ms > 0 || r.P99Ms > 0 {
			p50 = append(p50, r.P50Ms)
			p99 = append(p99, r.P99Ms)
			p999 = append(p999, r.P999Ms)
		}
		s.Errors += r.Errors
	}
	s.Rate = Median(rates)
	s.Seconds = Median(secs)
	if len(p50) > 0 {
		s.P50Ms = Median(p50)
		s.P99Ms = Median(p99)
		s.P999Ms = Median(p999)
	}
}

// Ratio compares two sides of one workload round by round.
type Ratio struct {
	Name        string    `json:"name"`
	Numerator   string    `json:"numerator"`
	Denominator string    `json:"denominator"`
	Value       float64   `json:"value"`  // median of the per-round ratios
	Rounds      []float64 `json:"rounds"` // Numerator's figure / Denominator's figure per round
	// Metric is the figure compared: "" for the rate, "p50_ms" or
	// "p99_ms" for a per-operation latency.
	Metric string `json:"metric,omitempty"`
	// Target, when set, is the goal: Value >= Target, or Value <=
	// Target when AtMost (a latency).
	Target *float64 `json:"target,omitempty"`
	AtMost bool     `json:"at_most,omitempty"`
	// Met is nil when there is no target, or no value to judge (Verdict
	// then says missed).
	Met *bool `json:"met,omitempty"`
}

// NewRatio pairs the rounds of num and den by index (round i of one side
// ran next to round i of the other) and takes the median of the per-round
// ratios of their rates, which cancels drift that hits both sides of one
// round alike. target <= 0 means no target; the target is Value >= target.
func NewRatio(name string, num, den *Side, target float64) Ratio {
	return newRatio(name, num, den, "", func(r Round) float64 { return r.Rate }, target, false)
}

// NewLatencyRatio is NewRatio on a latency percentile: metric is "p50_ms"
// or "p99_ms", and the target, when > 0, is Value <= target (lower is
// better).
func NewLatencyRatio(name string, num, den *Side, metric string, target float64) Ratio {
	get := func(r Round) float64 { return r.P50Ms }
	if metric == "p99_ms" {
		get = func(r Round) float64 { return r.P99Ms }
	}
	return newRatio(name, num, den, metric, get, target, true)
}

func newRatio(name string, num, den *Side, metric string, get func(Round) float64, target float64, atMost bool) Ratio {
	r := Ratio{Name: name, Numerator: num.Name, Denominator: den.Name, Value: math.NaN(), Metric: metric}
	n := min(len(num.Rounds), len(den.Rounds))
	for i := 0; i < n; i++ {
		if d := get(den.Rounds[i]); d > 0 {
			r.Rounds = append(r.Rounds, get(num.Rounds[i])/d)
		}
	}
	if len(r.Rounds) > 0 {
		r.Value = Median(r.Rounds)
	}
	if target > 0 {
		t := target
		r.Target, r.AtMost = &t, atMost
		if !math.IsNaN(r.Value) {
			met := r.Value >= target
			if atMost {
				met = r.Value <= target
			}
			r.Met = &met
		}
	}
	return r
}

// Verdict is "met" or "missed" for a ratio with a target ("missed (no
// value)" when no round could be compared), "" without a target.
func (r Ratio) Verdict() string {
	switch {
	case r.Target == nil:
		return ""
	case r.Met == nil:
		return "missed (no value)"
	case *r.Met:
		return "met"
	default:
		return "missed"
	}
}

// TargetText is the target and its verdict as the table prints it, e.g.
// "target >= 0.90x: met" ("" without a target).
func (r Ratio) TargetText() string {
	if r.Target == nil {
		return ""
	}
	op := ">="
	if r.AtMost {
		op = "<="
	}
	return fmt.Sprintf("target %s %.2fx: %s", op, *r.Target, r.Verdict())
}

// MarshalJSON writes NaN values as null (encoding/json rejects NaN).
func (r Ratio) MarshalJSON() ([]byte, error) {
	type plain Ratio
	var v *float64
	if !math.IsNaN(r.Value) && !math.IsInf(r.Value, 0) {
		x := r.Value
		v = &x
	}
	return json.Marshal(struct {
		plain
		Value *float64 `json:"value"`
	}{plain(r), v})
}

// Workload is one workload's sides, ratios and notes.
type Workload struct {
	Name   string            `json:"name"`
	Sides  []*Side           `json:"sides"`
	Ratios []Ratio           `json:"ratios"`
	Notes  []string          `json:"notes,omitempty"`
	Params map[string]string `json:"params,omitempty"`
	// Counts are statement and round-trip counts per operation (workload
	// roundtrips).
	Counts []Count `json:"counts,omitempty"`
	// Scale is the scale curve, one entry per database, id layout and
	// size (workload scale, scale.go).
	Scale []*ScalePoint `json:"scale,omitempty"`
	Error string        `json:"error,omitempty"`
}

// Side returns the side named name, or nil.
func (w *Workload) Side(name string) *Side {
	for _, s := range w.Sides {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// UnjudgePaced drops the target of every ratio with a paced side (-rate):
// sides held to one rate compare their CPU per operation, not their speed,
// and their latencies carry no queueing, so no target is met or missed.
func (w *Workload) UnjudgePaced() {
	paced, rate := map[string]bool{}, 0.0
	for _, s := range w.Sides {
		if s.Paced > 0 {
			paced[s.Name], rate = true, max(rate, s.Paced)
		}
	}
	if len(paced) == 0 {
		return
	}
	n := 0
	for i := range w.Ratios {
		r := &w.Ratios[i]
		if (paced[r.Numerator] || paced[r.Denominator]) && r.Target != nil {
			r.Target, r.Met, r.AtMost = nil, nil, false
			n++
		}
	}
	w.Notes = append(w.Notes, fmt.Sprintf("-rate: the Send sides were paced (at most %g operations a second each): %d ratios judge no target; compare the sides' CPU per operation (-cpu-split)", rate, n))
}

// AddRatio adds num/den when both sides have rounds.
func (w *Workload) AddRatio(name, num, den string, target float64) {
	n, d := w.Side(num), w.Side(den)
	if n == nil || d == nil || len(n.Rounds) == 0 || len(d.Rounds) == 0 {
		return
	}
	w.Ratios = append(w.Ratios, NewRatio(name, n, d, target))
}

// Machine describes where the run happened.
type Machine struct {
	Cores         int    `json:"cores"`
	GOMAXPROCS    int    `json:"gomaxprocs"`
	MemoryBytes   uint64 `json:"memory_bytes"`
	CPUModel      string `json:"cpu_model,omitempty"`
	GoVersion     string `json:"go_version"`
	OSArch        string `json:"os_arch"`
	BrokerVersion string `json:"broker_version"`
	// Client is the rocketmq-client-go this binary links: the upstream
	// module (what a service that imports rmqtx builds) or the patched copy
	// that go.mod's replace selects (make bench: RMQTX_BENCH_CLIENT).
	Client    string `json:"client"`
	DBVersion string `json:"db_version"`
	// DBFlush is the server's innodb_flush_log_at_trx_commit (1: durable,
	// the default; 2: the test bed's).
	DBFlush string `json:"db_flush_log_at_trx_commit,omitempty"`
	// LoadStart and LoadEnd are /proc/loadavg at the start and the end.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
	Hostname  string `json:"hostname,omitempty"`
}

// Report is everything one run measured: the JSON document.
type Report struct {
	StartedAt  time.Time         `json:"started_at"`
	Seconds    float64           `json:"seconds"`
	Command    string            `json:"command"`
	Machine    Machine           `json:"machine"`
	Settings   map[string]string `json:"settings"`
	Workloads  []*Workload       `json:"workloads"`
	TargetsMet int               `json:"targets_met"`
	TargetsAll int               `json:"targets_all"`
}

// Finish counts the targets; one without a value counts as missed.
func (r *Report) Finish() {
	r.TargetsMet, r.TargetsAll = 0, 0
	for _, w := range r.Workloads {
		for _, ra := range w.Ratios {
			if ra.Target != nil {
				r.TargetsAll++
				if ra.Met != nil && *ra.Met {
					r.TargetsMet++
				}
			}
		}
	}
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func fmtRate(x float64) string {
	switch {
	case math.IsNaN(x):
		return "-"
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func fmtMs(x float64) string {
	if x <= 0 {
		return "-"
	}
	if x >= 100 {
		return fmt.Sprintf("%.0fms", x)
	}
	return fmt.Sprintf("%.2fms", x)
}

func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", x)
}

// WriteTable writes the human-readable table.
func (r *Report) WriteTable(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "rmqtx-bench %s  (%.0fs)\n", r.StartedAt.UTC().Format(time.RFC3339), r.Seconds)
	fmt.Fprintf(w, "machine: %d cores (GOMAXPROCS %d), %.1f GiB, %s, %s, %s\n",
		m.Cores, m.GOMAXPROCS, float64(m.MemoryBytes)/(1<<30), m.CPUModel, m.GoVersion, m.OSArch)
	flush := "innodb_flush_log_at_trx_commit=" + m.DBFlush
	if strings.HasPrefix(m.DBVersion, "PostgreSQL") {
		flush = m.DBFlush // PostgreSQL's settings, named (env.go ReadMachine)
	}
	fmt.Fprintf(w, "services: RocketMQ %s, %s (%s)\n", m.BrokerVersion, m.DBVersion, flush)
	fmt.Fprintf(w, "client: %s\n", m.Client)
	if m.LoadStart != "" {
		fmt.Fprintf(w, "load average: %s at the start, %s at the end\n", m.LoadStart, m.LoadEnd)
	}
	if d := r.Settings["net_delay"]; d != "" {
		fmt.Fprintf(w, "network: %s each way between every side and the database, the name server and the brokers (loopback delay proxies, -net-delay)\n", d)
	}
	keys := make([]string, 0, len(r.Settings))
	for k := range r.Settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var kv []string
	for _, k := range keys {
		kv = append(kv, k+"="+r.Settings[k])
	}
	fmt.Fprintf(w, "settings: %s\n", strings.Join(kv, " "))
	if r.Command != "" {
		fmt.Fprintf(w, "command: %s\n", r.Command)
	}
	for _, wl := range r.Workloads {
		fmt.Fprintf(w, "\n== %s", wl.Name)
		if len(wl.Params) > 0 {
			pk := make([]string, 0, len(wl.Params))
			for k := range wl.Params {
				pk = append(pk, k)
			}
			sort.Strings(pk)
			var ps []string
			for _, k := range pk {
				ps = append(ps, k+"="+wl.Params[k])
			}
			fmt.Fprintf(w, "  (%s)", strings.Join(ps, " "))
		}
		fmt.Fprintln(w)
		if wl.Error != "" {
			fmt.Fprintf(w, "  ERROR: %s\n", wl.Error)
		}
		if len(wl.Sides) > 0 {
			fmt.Fprintf(w, "  %-34s %12s %9s %9s %9s %8s %6s  %s\n", "side", "rate (median)", "p50", "p99", "p99.9", "secs", "errors", "rounds")
		}
		for _, s := range wl.Sides {
			if s.Skipped != "" {
				fmt.Fprintf(w, "  %-34s skipped: %s\n", s.Name, s.Skipped)
				continue
			}
			var rr []string
			for _, ro := range s.Rounds {
				rr = append(rr, fmtRate(ro.Rate))
			}
			fmt.Fprintf(w, "  %-34s %12s %9s %9s %9s %8.2f %6d  %s\n", s.Name,
				fmtRate(s.Rate)+" "+s.Unit, fmtMs(s.P50Ms), fmtMs(s.P99Ms), fmtMs(s.P999Ms), s.Seconds, s.Errors, strings.Join(rr, " "))
		}
		writeCPUSplitTable(w, "  ", wl.Sides)
		for _, ra := range wl.Ratios {
			target := ra.TargetText()
			var rr []string
			for _, x := range ra.Rounds {
				rr = append(rr, fmtRatio(x))
			}
			fmt.Fprintf(w, "  ratio %-44s %7s  %-26s rounds %s\n", ra.Name, fmtRatio(ra.Value), target, strings.Join(rr, " "))
		}
		for _, c := range wl.Counts {
			fmt.Fprintf(w, "  %-62s %s\n", c.Path, c.Summary)
		}
		for _, n := range wl.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
	}
	fmt.Fprintf(w, "\ntargets met: %d of %d\n", r.TargetsMet, r.TargetsAll)
}
