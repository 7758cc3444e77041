package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"
)

// The keys a serverProbe writes into a Round's Extra: CPU per operation of
// each process, the share of the machine's cores busy in the round, the redo or
// WAL bytes written, and on MariaDB InnoDB's own counters per operation.
const (
	probeCPUBench  = "cpu_bench_us_per_op"  // this process (the workload, and an archiver it runs)
	probeCPUDB     = "cpu_db_us_per_op"     // the database server with its process tree
	probeCPUBroker = "cpu_broker_us_per_op" // the broker
	probeCoresBusy = "cores_busy"           // (bench + database + broker CPU) / (wall time x cores)
	probePoolReqs  = "innodb_page_reads_per_op"
	probePoolDisk  = "innodb_disk_reads_per_op"
	probeRowsRead  = "rows_read_per_op" // MariaDB's Handler_read_* (index lookups and steps, scanned rows)
	probePoolWrite = "innodb_page_writes_per_op"
	probeFlushed   = "innodb_pages_flushed_per_op" // dirty pages written back to disk
	probeLockWaits = "innodb_row_lock_waits"
	probeHistory   = "innodb_history_list_length" // at the round's end: undo not yet purged
	probeLogBytes  = "log_bytes_per_op"           // redo (Innodb_os_log_written) or WAL (pg_current_wal_insert_lsn) written
)

// innodbStatus maps the MariaDB status variables a probe reads to the
// Extra key of their per-operation delta (keys that repeat are summed).
// Buffer pool read requests are pages looked up (a deeper B-tree costs more
// per point read), buffer pool reads the ones that missed the pool and came
// from disk. MariaDB 10.11 has no Innodb_rows_read: the handler counters
// count the rows.
var innodbStatus = map[string]string{
	"Innodb_buffer_pool_read_requests":  probePoolReqs,
	"Innodb_buffer_pool_reads":          probePoolDisk,
	"Innodb_buffer_pool_write_requests": probePoolWrite,
	"Innodb_buffer_pool_pages_flushed":  probeFlushed,
	"Innodb_row_lock_waits":             probeLockWaits,
	"Innodb_history_list_length":        probeHistory,
	"Innodb_os_log_written":             probeLogBytes,
	"Handler_read_first":                probeRowsRead,
	"Handler_read_key":                  probeRowsRead,
	"Handler_read_last":                 probeRowsRead,
	"Handler_read_next":                 probeRowsRead,
	"Handler_read_prev":                 probeRowsRead,
	"Handler_read_rnd":                  probeRowsRead,
	"Handler_read_rnd_next":             probeRowsRead,
}

// probeKeys is the order the probe's figures are printed in.
var probeKeys = []string{probeCPUBench, probeCPUDB, probeCPUBroker, probeCoresBusy, probeLogBytes, probePoolReqs, probePoolDisk, probeRowsRead, probePoolWrite, probeFlushed, probeLockWaits, probeHistory}

// serverProbe measures what a round cost the machine, so that a rate that
// fell can be explained by the servers' own figures: CPU per operation
// from /proc (cpuMeter), and on MariaDB the InnoDB counters from SHOW
// GLOBAL STATUS, read before and after the round; on PostgreSQL the WAL
// written (pg_current_wal_insert_lsn, exact at any moment). They are
// global: a round must run alone. PostgreSQL's cumulative statistics are
// flushed by each backend up to seconds late, so they are not read per
// round.
type serverProbe struct {
	meter  cpuMeter
	db     *sqlx.DB
	engine string
}

// probeSnap is the state at the start of a round.
type probeSnap struct {
	at     time.Time
	cpu    cpuSample
	status map[string]float64
}

func newServerProbe(e *Env, db *sqlx.DB) *serverProbe {
	return &serverProbe{meter: newCPUMeter(e.S.DBAddr(), e.S.Broker), db: db, engine: e.S.Engine}
}

// begin reads the counters at the start of a round.
func (p *serverProbe) begin(ctx context.Context) probeSnap {
	if p == nil {
		return probeSnap{}
	}
	s := probeSnap{at: time.Now(), cpu: p.meter.sample()}
	s.status, _ = p.counters(ctx) // a failed read leaves the round without InnoDB figures
	return s
}

// end adds to r.Extra the figures per operation (r.Count) since s.
func (p *serverProbe) end(ctx context.Context, s probeSnap, r *Round) {
	if p == nil || s.at.IsZero() || r.Count <= 0 {
		return
	}
	cpu := p.meter.sample().sub(s.cpu)
	wall := time.Since(s.at)
	status, err := p.counters(ctx)
	if r.Extra == nil {
		r.Extra = map[string]float64{}
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(r.Count) }
	busy := cpu.self
	r.Extra[probeCPUBench] = per(cpu.self)
	if cpu.dbOK {
		r.Extra[probeCPUDB] = per(cpu.db)
		busy += cpu.db
	}
	if cpu.brokerOK {
		r.Extra[probeCPUBroker] = per(cpu.broker)
		busy += cpu.broker
	}
	if wall > 0 {
		r.Extra[probeCoresBusy] = busy.Seconds() / (wall.Seconds() * float64(runtime.NumCPU()))
	}
	if err != nil || s.status == nil {
		return
	}
	for name, key := range innodbStatus {
		v0, ok0 := s.status[name]
		v1, ok1 := status[name]
		if !ok0 || !ok1 {
			continue
		}
		switch key {
		case probeLockWaits:
			r.Extra[key] += v1 - v0 // a count per round: waits are rare
			continue
		case probeHistory:
			r.Extra[key] = v1 // a gauge
			continue
		}
		r.Extra[key] += (v1 - v0) / float64(r.Count)
	}
}

// counters reads the status variables of innodbStatus (MariaDB), or the WAL
// position under the same name as MariaDB's redo counter (PostgreSQL).
func (p *serverProbe) counters(ctx context.Context) (map[string]float64, error) {
	if p.db == nil {
		return nil, nil
	}
	if p.engine == enginePostgres {
		var lsn float64
		if err := p.db.GetContext(ctx, &lsn, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::float8"); err != nil {
			return nil, err
		}
		return map[string]float64{"Innodb_os_log_written": lsn}, nil
	}
	names := make([]string, 0, len(innodbStatus))
	for n := range innodbStatus {
		names = append(names, "'"+n+"'") // constants, not input
	}
	slices.Sort(names)
	rows, err := p.db.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ("+strings.Join(names, ",")+")")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var name string
		var v float64
		if err := rows.Scan(&name, &v); err != nil {
			return nil, err
		}
		out[name] = v
	}
	return out, rows.Err()
}

// probeLine is one side's probe figures, medians over its rounds:
// "cpu µs/op bench 120 db 80 broker 160, cores busy 0.93, InnoDB/op pages
// 12.1 disk 0.00 rows 3.0 written 8.0".
func probeLine(rounds []Round) string {
	med := func(k string) (float64, bool) {
		v := medianExtra(rounds, k)
		return v, v == v // NaN: no round had it
	}
	var parts []string
	var cpu []string
	for _, k := range []struct{ key, name string }{{probeCPUBench, "bench"}, {probeCPUDB, "db"}, {probeCPUBroker, "broker"}} {
		if v, ok := med(k.key); ok {
			cpu = append(cpu, fmt.Sprintf("%s %.0f", k.name, v))
		}
	}
	if len(cpu) > 0 {
		parts = append(parts, "cpu µs/op "+strings.Join(cpu, " "))
	}
	if v, ok := med(probeCoresBusy); ok {
		parts = append(parts, fmt.Sprintf("cores busy %.2f", v))
	}
	if v, ok := med(probeLogBytes); ok {
		parts = append(parts, fmt.Sprintf("log bytes/op %.0f", v))
	}
	var inno []string
	for _, k := range []struct{ key, name, f string }{{probePoolReqs, "pages", "%.1f"}, {probePoolDisk, "disk", "%.2f"}, {probeRowsRead, "rows", "%.1f"}, {probePoolWrite, "written", "%.1f"}, {probeFlushed, "flushed", "%.2f"}, {probeLockWaits, "lock waits/round", "%.0f"}, {probeHistory, "history list", "%.0f"}} {
		if v, ok := med(k.key); ok {
			inno = append(inno, k.name+" "+fmt.Sprintf(k.f, v))
		}
	}
	if len(inno) > 0 {
		parts = append(parts, "InnoDB/op "+strings.Join(inno, " "))
	}
	return strings.Join(parts, ", ")
}

// probeNotes is "name: probeLine" for each side that has probe figures,
// the name without prefix.
func probeNotes(sides []*Side, prefix string) []string {
	var out []string
	for _, s := range sides {
		if line := probeLine(s.Rounds); line != "" {
			out = append(out, strings.TrimPrefix(s.Name, prefix)+": "+line)
		}
	}
	return out
}

// probeMedians is the side's probe figures (medians over its rounds) for
// the JSON.
func probeMedians(rounds []Round) map[string]float64 {
	out := map[string]float64{}
	for _, k := range probeKeys {
		if v := medianExtra(rounds, k); v == v {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
