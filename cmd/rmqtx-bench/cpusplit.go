package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// The CPU split (-cpu-split, issue 35): where the CPU of one committed
// Send, or of one consumed message, goes. Each producer round is profiled on its own (runtime/pprof at
// its default 100 Hz; the sides' rounds run one after another, so a
// round's profile holds only that side's work, its background goroutines
// and the runtime), and every sample is charged to one part of the code by
// the first frame, walking from the leaf up, that belongs to a known part:
// a syscall made by the driver is the driver's, an allocation made by
// rmqtx is rmqtx's. Samples with no known frame at all (GC workers, the
// scheduler, the netpoller) are "runtime/other". The broker's and the
// database's CPU over the same round come from /proc.

// The parts of the bench process's CPU, in table order.
const (
	partRmqtx  = "rmqtx"
	partClient = "client"
	partSQL    = "sql+driver"
	partBench  = "bench"
	partOther  = "runtime/other"
)

var cpuParts = []string{partRmqtx, partClient, partSQL, partBench, partOther}

// Round.Extra keys of the split: CPU microseconds per committed operation.
const (
	extraCPUPrefix   = "cpu_us_per_tx_" // + a part name, "broker", "database" or "total"
	extraCPUBroker   = extraCPUPrefix + "broker"
	extraCPUDatabase = extraCPUPrefix + "database"
	// The parts of the two servers' CPU read apart (where measured): the
	// broker's network threads, and PostgreSQL's sessions.
	extraCPUBrokerNet  = extraCPUPrefix + "broker_network"
	extraCPUDBSessions = extraCPUPrefix + "database_sessions"
	extraCPUTotal      = extraCPUPrefix + "total"
	// extraCPUProcess is the bench process's CPU by getrusage over the
	// same window: the profile's sum should come close to it.
	extraCPUProcess = "cpu_us_per_tx_process_rusage"
	// extraCPUSamples is the round's profile samples (not per tx): at
	// 100 Hz a part with n samples is known to about ±sqrt(n).
	extraCPUSamples = "cpu_profile_samples"
)

// extraCPUPart is the Round.Extra key of a part.
func extraCPUPart(part string) string {
	return extraCPUPrefix + strings.NewReplacer("+", "_", "/", "_").Replace(part)
}

// partPrefixes map function-name prefixes to parts. Function names carry
// the package's import path, and a replace directive does not change it:
// the patched client in third_party/ (go.mod's replace) and the upstream
// module (scripts/upstream-mod.sh) both appear as
// github.com/apache/rocketmq-client-go/v2/..., so "client" is the same in
// both builds. The bench is package main ("main." in the binary, its import
// path in its test binary).
var partPrefixes = []struct{ prefix, part string }{
	{"main.", partBench},
	{"github.com/rmqtx/rmqtx/cmd/rmqtx-bench.", partBench},
	{"github.com/rmqtx/rmqtx/third_party/", partClient},
	{"github.com/rmqtx/rmqtx/", partRmqtx},
	{"github.com/apache/rocketmq-client-go/", partClient},
	{"database/sql.", partSQL},
	{"database/sql/driver.", partSQL},
	{"github.com/go-sql-driver/mysql.", partSQL},
	{"github.com/jackc/", partSQL}, // pgx, its pgconn and the puddle pool
	{"github.com/jmoiron/sqlx.", partSQL},
}

// framePart returns the part a frame belongs to, "" for none (the runtime,
// the standard library, a library reached through any of the parts).
func framePart(function, file string) string {
	for _, p := range partPrefixes {
		if strings.HasPrefix(function, p.prefix) {
			return p.part
		}
	}
	// A copy of the client outside the module cache still names its
	// functions by the upstream path; this catches a build that vendors it
	// under another import path.
	if strings.Contains(filepath.ToSlash(file), "/third_party/rocketmq-client-go/") {
		return partClient
	}
	return ""
}

// samplePart walks a sample's stack from the leaf up (Location[0] is the
// leaf; in a location, Line[0] is the innermost inlined function) to the
// first frame of a known part.
func samplePart(s *profile.Sample) string {
	for _, loc := range s.Location {
		for _, ln := range loc.Line {
			if ln.Function == nil {
				continue
			}
			if p := framePart(ln.Function.Name, ln.Function.Filename); p != "" {
				return p
			}
		}
	}
	return partOther
}

// splitProfile returns the CPU time of each part in p, and the number of
// samples.
func splitProfile(p *profile.Profile) (map[string]time.Duration, int64, error) {
	cpu := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			cpu = i
		}
	}
	samples := -1
	for i, st := range p.SampleType {
		if st.Type == "samples" {
			samples = i
		}
	}
	if cpu < 0 && (samples < 0 || p.Period <= 0) {
		return nil, 0, fmt.Errorf("cpu split: profile has no cpu/nanoseconds values and no sampling period")
	}
	out := make(map[string]time.Duration, len(cpuParts))
	var n int64
	for _, s := range p.Sample {
		var d time.Duration
		if cpu >= 0 {
			d = time.Duration(s.Value[cpu])
		} else {
			d = time.Duration(s.Value[samples] * p.Period)
		}
		if samples >= 0 {
			n += s.Value[samples]
		}
		out[samplePart(s)] += d
	}
	return out, n, nil
}

// cpuSplitter profiles the rounds of one workload; nil when the split is
// off (every method is a no-op on nil).
type cpuSplitter struct {
	meter cpuMeter
	errs  map[string]bool

	buf bytes.Buffer
	on  bool
	t0  cpuSample

	dir  string // -cpu-split-dir: where save writes the last round's profile
	last []byte // the last finished round's profile, until save
}

// newCPUSplitter returns the splitter of w, or nil unless -cpu-split is on
// and w is the producer, the localtx or the consumer workload.
func newCPUSplitter(e *Env, w *Workload) *cpuSplitter {
	if !e.Opt.CPUSplit || (w.Name != "producer" && w.Name != "localtx" && w.Name != "consumer") {
		return nil
	}
	s := &cpuSplitter{meter: newCPUMeter(e.S.DBAddr(), e.S.Broker), dir: e.Opt.CPUSplitDir}
	if s.dir != "" {
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			s.note(w, fmt.Errorf("cpu split: %w", err))
			s.dir = ""
		}
	}
	if s.meter.dbPID == 0 {
		w.Notes = append(w.Notes, "cpu split: no process listening on "+e.S.DBAddr()+" found in /proc: no database column")
	}
	if s.meter.brokerPID == 0 {
		w.Notes = append(w.Notes, "cpu split: no process listening on "+e.S.Broker+" found in /proc: no broker column")
	}
	return s
}

// begin starts the round's profile, right before its loop; an error
// (another CPU profile running) leaves the round without a split and is
// noted in w once.
func (s *cpuSplitter) begin(w *Workload) {
	if s == nil {
		return
	}
	s.buf.Reset()
	s.on = false
	t0 := s.meter.sample() // outside the profile: reading /proc is not the round's work
	if err := pprof.StartCPUProfile(&s.buf); err != nil {
		s.note(w, fmt.Errorf("cpu split: %w", err))
		return
	}
	s.on, s.t0 = true, t0
}

// finish stops the round's profile, right after its loop, and adds the
// split per committed operation (r.Count) to r.Extra.
func (s *cpuSplitter) finish(w *Workload, r *Round) { s.finishOps(w, r, r.Count) }

// finishOps is finish with the split per ops operations: a consumer
// round's profile covers the messages processed between its first and its
// last poll, not r.Count.
func (s *cpuSplitter) finishOps(w *Workload, r *Round, ops int64) {
	if s == nil || !s.on {
		return
	}
	pprof.StopCPUProfile()
	d := s.meter.sample().sub(s.t0)
	s.on = false
	if s.dir != "" {
		s.last = bytes.Clone(s.buf.Bytes())
	}
	p, err := profile.Parse(&s.buf)
	if err != nil {
		s.note(w, fmt.Errorf("cpu split: parse profile: %w", err))
		return
	}
	parts, samples, err := splitProfile(p)
	if err != nil {
		s.note(w, err)
		return
	}
	if ops <= 0 {
		return
	}
	if r.Extra == nil {
		r.Extra = map[string]float64{}
	}
	addCPUSplit(r.Extra, parts, d, d.self, ops)
	r.Extra[extraCPUSamples] = float64(samples)
}

// save writes the last finished round's profile (-cpu-split-dir) as
// <workload>-<side>-r<round>.pprof, the side's name in lower case with
// every run of other characters than letters and digits as one '-'.
func (s *cpuSplitter) save(w *Workload, side string, round int) {
	if s == nil || s.dir == "" || s.last == nil {
		return
	}
	name := filepath.Join(s.dir, fmt.Sprintf("%s-%s-r%d.pprof", w.Name, profileSlug(side), round))
	if err := os.WriteFile(name, s.last, 0o644); err != nil {
		s.note(w, fmt.Errorf("cpu split: %w", err))
	}
	s.last = nil
}

// profileSlug is side as a file name part: "rmqtx first delivery,
// NoCrashCount" is "rmqtx-first-delivery-nocrashcount".
func profileSlug(side string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(side) {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(r)
			dash = false
			continue
		}
		dash = true
	}
	return b.String()
}

func (s *cpuSplitter) note(w *Workload, err error) {
	if s.errs == nil {
		s.errs = map[string]bool{}
	}
	if !s.errs[err.Error()] {
		s.errs[err.Error()] = true
		w.Notes = append(w.Notes, err.Error())
	}
}

// summarize sets every side's CPUSplit from its rounds, logs the table and
// adds the notes on the method.
func (s *cpuSplitter) summarize(e *Env, w *Workload) {
	if s == nil {
		return
	}
	for _, side := range w.Sides {
		summarizeCPUSplit(side)
	}
	var b strings.Builder
	writeCPUSplitTable(&b, "  ", w.Sides)
	for _, line := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
		if line != "" {
			e.Log("%s", line)
		}
	}
	w.Notes = append(w.Notes, cpuSplitNotes(w)...)
}

// addCPUSplit writes the per-operation split into extra: each part of the
// bench process, the broker and the database when measured, the total of
// them all, and the bench's getrusage figure as a cross-check.
func addCPUSplit(extra map[string]float64, parts map[string]time.Duration, servers cpuSample, rusage time.Duration, ops int64) {
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(ops) }
	var total time.Duration
	for _, part := range cpuParts {
		extra[extraCPUPart(part)] = per(parts[part])
		total += parts[part]
	}
	if servers.brokerOK {
		extra[extraCPUBroker] = per(servers.broker)
		total += servers.broker
	}
	if servers.dbOK {
		extra[extraCPUDatabase] = per(servers.db)
		total += servers.db
	}
	if servers.brokerNetOK {
		extra[extraCPUBrokerNet] = per(servers.brokerNet)
	}
	if servers.dbSessionsOK {
		extra[extraCPUDBSessions] = per(servers.dbSessions)
	}
	extra[extraCPUTotal] = per(total)
	extra[extraCPUProcess] = per(rusage)
}

// CPUSplit is a side's CPU per committed operation, in microseconds, by
// part: medians over the rounds, each column on its own (so the parts need
// not add up to Total exactly). Broker and Database are nil when their
// process was not found.
type CPUSplit struct {
	Rmqtx        float64  `json:"rmqtx_us"`
	Client       float64  `json:"client_us"`
	SQL          float64  `json:"sql_driver_us"`
	Bench        float64  `json:"bench_us"`
	RuntimeOther float64  `json:"runtime_other_us"`
	Broker       *float64 `json:"broker_us,omitempty"`
	Database     *float64 `json:"database_us,omitempty"`
	// BrokerNetwork is the part of Broker spent by its Netty server threads
	// (sockets and frames); DatabaseSessions the part of Database spent by
	// PostgreSQL's processes serving connections, without its background
	// processes (autovacuum, WAL writer, checkpointer, exited workers),
	// whose work comes due on its own schedule and lands on whichever side
	// runs then. Nil where not measured (DatabaseSessions on MariaDB: one
	// process).
	BrokerNetwork    *float64 `json:"broker_network_us,omitempty"`
	DatabaseSessions *float64 `json:"database_sessions_us,omitempty"`
	Total            float64  `json:"total_us"`
	// ProcessRusage is the bench process's CPU by getrusage over the same
	// windows: the five bench-process parts should come close to it.
	ProcessRusage float64 `json:"process_rusage_us"`
	// Samples is the median of the rounds' profile sample counts: a part
	// of n samples is known to about ±sqrt(n) samples (10 ms each).
	Samples float64 `json:"profile_samples"`
	Rounds  int     `json:"rounds"`
}

// summarizeCPUSplit sets the side's CPUSplit from its rounds' extras (nil
// when no round has one).
func summarizeCPUSplit(s *Side) {
	n := 0
	for _, r := range s.Rounds {
		if _, ok := r.Extra[extraCPUTotal]; ok {
			n++
		}
	}
	if n == 0 {
		return
	}
	med := func(key string) float64 { return medianExtra(s.Rounds, key) }
	opt := func(key string) *float64 {
		if v := med(key); !math.IsNaN(v) {
			return &v
		}
		return nil
	}
	s.CPUSplit = &CPUSplit{
		Rmqtx: med(extraCPUPart(partRmqtx)), Client: med(extraCPUPart(partClient)), SQL: med(extraCPUPart(partSQL)),
		Bench: med(extraCPUPart(partBench)), RuntimeOther: med(extraCPUPart(partOther)),
		Broker: opt(extraCPUBroker), Database: opt(extraCPUDatabase),
		BrokerNetwork: opt(extraCPUBrokerNet), DatabaseSessions: opt(extraCPUDBSessions),
		Total: med(extraCPUTotal), ProcessRusage: med(extraCPUProcess), Rounds: n,
	}
	if v := med(extraCPUSamples); !math.IsNaN(v) {
		s.CPUSplit.Samples = v
	}
}

// writeCPUSplitTable writes the split of every side that has one, each
// line after indent; nothing when no side has one.
func writeCPUSplitTable(w io.Writer, indent string, sides []*Side) {
	var rows []*Side
	for _, s := range sides {
		if s.CPUSplit != nil {
			rows = append(rows, s)
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "%scpu split per op (µs): %-34s %7s %7s %10s %7s %13s %7s %7s %8s %8s %7s\n", indent,
		"side", "rmqtx", "client", "sql+driver", "bench", "runtime/other", "broker", "(net)", "database", "(sess.)", "total")
	us := func(x float64) string {
		if math.IsNaN(x) {
			return "-"
		}
		return fmt.Sprintf("%.0f", x)
	}
	opt := func(x *float64) string {
		if x == nil {
			return "-"
		}
		return us(*x)
	}
	for _, s := range rows {
		c := s.CPUSplit
		fmt.Fprintf(w, "%s                      %-34s %7s %7s %10s %7s %13s %7s %7s %8s %8s %7s\n", indent, s.Name,
			us(c.Rmqtx), us(c.Client), us(c.SQL), us(c.Bench), us(c.RuntimeOther), opt(c.Broker), opt(c.BrokerNetwork),
			opt(c.Database), opt(c.DatabaseSessions), us(c.Total))
	}
}

// cpuSplitNotes say how the split was measured (none when it is off).
func cpuSplitNotes(w *Workload) []string {
	on := false
	for _, s := range w.Sides {
		on = on || s.CPUSplit != nil
	}
	if !on {
		return nil
	}
	return []string{
		"cpu split (-cpu-split): each side's every round is profiled on its own (runtime/pprof, default 100 Hz sampling, the sides' rounds run one after another); a sample's CPU goes to the first frame, walking from the leaf up, of rmqtx (github.com/rmqtx/rmqtx/...), the client (github.com/apache/rocketmq-client-go, patched or upstream alike), sql+driver (database/sql, go-sql-driver/mysql, jackc/pgx, jmoiron/sqlx) or the bench (its loop, payloads, checks); samples with none of them (GC workers, scheduler, netpoller) are runtime/other",
		"cpu split: broker and database are their processes' CPU (utime+stime from /proc, PostgreSQL's per-connection processes included) over the same round: other clients of those servers count too; so do, in the bench process, the idle producers of the other sides (heartbeats, route updates, discard recovery), which is why a raw side can show a little rmqtx; every figure is microseconds per committed Send (producer) or per processed message (consumer, over the window its rate is measured in), the median over rounds of each column on its own (columns need not add up to total)",
		"cpu split: (net) is the part of the broker's CPU spent by its Netty server threads (reading and writing its sockets, coding frames), which costs more per request when each wake-up finds fewer requests, so it moves with the sides' pacing as well as with what they send; (sess.) is the part of PostgreSQL's CPU spent by the processes serving connections, without its background processes (autovacuum, WAL writer, checkpointer, exited workers), whose work comes due on its own schedule and lands on whichever side runs then (- where not measured: MariaDB is one process)",
		"cpu split: a part of n samples is known to about ±sqrt(n) samples of 10 ms, so short rounds give rough figures; the JSON's cpu_split has the samples per round (profile_samples) and the bench process's getrusage CPU (process_rusage_us); the five bench parts come out below it, by up to a sampling period per busy thread per round (each thread's profiling timer has not fired for the CPU since its last sample), which matters less the longer the round",
	}
}
