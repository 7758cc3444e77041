//go:build linux

// Command pgcpu measures PostgreSQL's CPU per consumed event for the
// consumer's first-delivery transaction, with no broker: the same
// transaction written by hand and run by rmqtx's Processor, side by side,
// on the PostgreSQL of scripts/services.sh. It answers where the
// database's extra CPU per event in rmqtx-bench's consumer workload comes
// from (BENCHMARKS.md, "PostgreSQL first delivery: where the rest goes").
//
// Each mode drains -n events with -g goroutines, one transaction each:
//
//	hand       BEGIN; INSERT the bench's hand-written dedup row (group, id, time) ON CONFLICT DO NOTHING; business INSERT; COMMIT
//	hand-log   the same with rmqtx's dedup statement on a copy of rmqtx's consume log (its row and indexes)
//	rmqtx      consumer.Processor.Process (NoCrashCount, no version guard): the same four statements
//	hand-burn  hand, then -burn µs of client CPU per event after the commit (the database's work is unchanged)
//	hand-timeout  hand, each transaction under its own 30 s deadline, as the Processor's ProcessTimeout puts it
//	hand-checked  the hand-written transaction doing the Processor's work: the message's properties map (as rmqtx gets it),
//	              its id and type read and checked, the payload's SHA-256 checked against the declared one and kept in the
//	              dedup row with the type, a duplicate's stored hash read and compared, a 30 s deadline
//	hand-checked-log  hand-checked writing rmqtx's row (rmqtx's statement, columns and values) into a copy of
//	              rmqtx's consume log: the same work and the same row as rmqtx, written by hand
//
// Modes alternate within each round. A round prints the events per second,
// the database server's CPU per event (user + system of the postmaster and
// its children, from /proc) and this process's, and this process's
// allocations per event (count and bytes); the end prints medians
// and, for every other mode, its per-round differences from the first
// mode of -modes (paired: the same round): database CPU, this process's
// CPU, and the rate as a ratio.
//
// Usage (as root, services up):
//
//	eval "$(bash scripts/services.sh env)"
//	go run ./internal/tools/pgcpu -rounds 12 -modes hand,hand-burn -burn 60
//
// Linux only: it reads /proc and the thread's CPU clock.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/proccpu"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/wire"
)

const eventType = "BenchEvent"

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgcpu:", err)
		os.Exit(1)
	}
}

func run() error {
	n := flag.Int("n", 20000, "events per mode and round")
	g := flag.Int("g", 8, "goroutines (each with a connection)")
	rounds := flag.Int("rounds", 6, "rounds; modes alternate within each")
	modesFlag := flag.String("modes", "hand,hand-log,rmqtx", "comma-separated modes: hand, hand-log, rmqtx, hand-burn, hand-timeout, hand-checked, hand-checked-log")
	burnUS := flag.Int("burn", 60, "hand-burn: client CPU per event, in µs")
	pidFile := flag.String("pidfile", ".run/postgres/data/postmaster.pid", "the postmaster's pid file (scripts/services.sh's)")
	profile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	memProfile := flag.String("memprofile", "", "write an allocation profile of the whole run to this file (every allocation sampled)")
	flag.Parse()
	if *memProfile != "" {
		runtime.MemProfileRate = 1
		defer func() {
			if err := writeHeap(*memProfile); err != nil {
				fmt.Fprintln(os.Stderr, "pgcpu:", err)
			}
		}()
	}
	if *profile != "" {
		f, err := os.Create(*profile)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	modes := strings.Split(*modesFlag, ",")
	for _, m := range modes {
		if !slices.Contains([]string{"hand", "hand-log", "rmqtx", "hand-burn", "hand-timeout", "hand-checked", "hand-checked-log"}, m) {
			return fmt.Errorf("unknown mode %q", m)
		}
	}
	pm, err := postmaster(*pidFile)
	if err != nil {
		return err
	}
	dsn := os.Getenv("RMQTX_PG_DSN")
	if dsn == "" {
		return errors.New(`RMQTX_PG_DSN is not set: eval "$(bash scripts/services.sh env)"`)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return errors.New("RMQTX_PG_DSN cannot be parsed")
	}
	db := sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx")
	defer func() { _ = db.Close() }()
	db.SetMaxOpenConns(*g + 2)
	db.SetMaxIdleConns(*g + 2)
	ctx := context.Background()

	b := make([]byte, 3)
	_, _ = rand.Read(b)
	tag := "pgcpu" + hex.EncodeToString(b)
	prefix := tag + "_"
	if err := schema.MigrateAll(ctx, db, prefix); err != nil {
		return err
	}
	hand, logCopy, checked, checkedLog := tag+"_hand", tag+"_logcopy", tag+"_checked", tag+"_checkedlog"
	ddl := []string{
		`CREATE TABLE ` + hand + ` (consumer_group VARCHAR(255) NOT NULL, event_id VARCHAR(64) NOT NULL, created_at TIMESTAMPTZ(6) NOT NULL, PRIMARY KEY (consumer_group, event_id))`,
		`CREATE TABLE ` + checked + ` (consumer_group VARCHAR(255) NOT NULL, event_id VARCHAR(64) NOT NULL, event_type VARCHAR(128) NOT NULL, request_hash CHAR(64) NOT NULL, created_at TIMESTAMPTZ(6) NOT NULL, PRIMARY KEY (consumer_group, event_id))`,
		`CREATE TABLE ` + logCopy + ` (LIKE ` + prefix + `consume_log INCLUDING ALL)`,
		`CREATE TABLE ` + checkedLog + ` (LIKE ` + prefix + `consume_log INCLUDING ALL)`,
	}
	business := map[string]string{}
	for _, m := range modes {
		t := tag + "_orders_" + strings.ReplaceAll(m, "-", "_")
		business[m] = t
		ddl = append(ddl,
			`CREATE TABLE `+t+` (id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, event_id VARCHAR(64) NOT NULL, amount BIGINT NOT NULL, payload BYTEA NOT NULL, created_at TIMESTAMPTZ(6) NOT NULL)`,
			`CREATE INDEX `+t+`_event ON `+t+` (event_id)`)
	}
	defer func() {
		tables := []string{hand, logCopy, checked, checkedLog}
		for _, t := range business {
			tables = append(tables, t)
		}
		_, _ = db.ExecContext(ctx, "DROP TABLE IF EXISTS "+strings.Join(tables, ", "))
		_, _ = db.ExecContext(ctx, fmt.Sprintf("DO $$ DECLARE r record; BEGIN FOR r IN SELECT tablename FROM pg_tables WHERE tablename LIKE '%s%%' LOOP EXECUTE 'DROP TABLE ' || quote_ident(r.tablename) || ' CASCADE'; END LOOP; END $$", prefix))
	}()
	for _, q := range ddl {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	payload := make([]byte, 512)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	hash := wire.Hash(payload)
	// A message as the client hands it over: its own properties map (the
	// payload's hash computed once, not per event).
	template := wire.Envelope{EventID: "-", EventType: eventType}.Properties(payload)

	type figures struct{ rate, db, self, allocs, bytes float64 }
	results := map[string][]figures{}
	for r := 0; r < *rounds; r++ {
		for _, m := range modes {
			group := fmt.Sprintf("%s-r%d", m, r)
			insert := "INSERT INTO " + business[m] + " (event_id, amount, payload, created_at) VALUES ($1, $2, $3, CURRENT_TIMESTAMP(6))"
			var work func(ctx context.Context, id string) error
			switch m {
			case "rmqtx":
				p, err := consumer.NewProcessor(consumer.ProcessorConfig{
					Group: group, DB: db, TablePrefix: prefix, VersionMode: consumer.VersionNone, NoCrashCount: true,
					Routes: map[string]consumer.Route{eventType: {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
						_, err := tx.ExecContext(ctx, insert, ev.ID, int64(len(ev.Payload)), ev.Payload)
						return err
					}}},
				})
				if err != nil {
					return err
				}
				work = func(ctx context.Context, id string) error {
					props := maps.Clone(template)
					props[wire.PropEventID] = id
					out := p.Process(ctx, consumer.Message{Body: payload, Properties: props, Delivery: consumer.Delivery{Topic: "pgcpu"}})
					if out.Result != consumer.ResultApplied {
						return fmt.Errorf("event %s: %s: %w", id, out.Result, out.Err)
					}
					return nil
				}
			case "hand-checked", "hand-checked-log":
				dedup := "INSERT INTO " + checked + " (consumer_group, event_id, event_type, request_hash, created_at) VALUES ($1, $2, $3, $4, CURRENT_TIMESTAMP(6)) ON CONFLICT DO NOTHING"
				stored := "SELECT request_hash FROM " + checked + " WHERE consumer_group = $1 AND event_id = $2 FOR SHARE"
				dedupArgs := func(id, typ, h string) []any { return []any{group, id, typ, h} }
				if m == "hand-checked-log" { // rmqtx's row and statement (consumer.Processor on PostgreSQL)
					dedup = "INSERT INTO " + checkedLog + " (consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at) VALUES ($1, $2, $3, $4, 'SUCCESS', $5, statement_timestamp(), statement_timestamp()) ON CONFLICT (consumer_group, event_id) DO NOTHING"
					stored = "SELECT request_hash FROM " + checkedLog + " WHERE consumer_group = $1 AND event_id = $2 FOR SHARE"
					dedupArgs = func(id, typ, h string) []any { return []any{group, id, typ, h, 0} }
				}
				work = func(ctx context.Context, id string) error {
					props := maps.Clone(template)
					props[wire.PropEventID] = id
					ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
					defer cancel()
					id, typ := props[wire.PropEventID], props[wire.PropEventType]
					if id == "" || typ != eventType {
						return fmt.Errorf("event %q: no id or an unknown type", id)
					}
					sum := sha256.Sum256(payload)
					h := hex.EncodeToString(sum[:])
					if d := props[wire.PropPayloadHash]; d != "" && !strings.EqualFold(d, h) {
						return fmt.Errorf("event %s: the payload is not the declared one", id)
					}
					tx, err := db.BeginTxx(ctx, nil)
					if err != nil {
						return err
					}
					res, err := tx.ExecContext(ctx, dedup, dedupArgs(id, typ, h)...)
					if err != nil {
						_ = tx.Rollback()
						return err
					}
					if n, err := res.RowsAffected(); err != nil || n == 0 {
						var got string
						if err == nil {
							err = tx.GetContext(ctx, &got, stored, group, id)
						}
						_ = tx.Rollback()
						if err != nil {
							return err
						}
						return fmt.Errorf("event %s: a duplicate (the same hash: %t), each event is new here", id, got == h)
					}
					if _, err := tx.ExecContext(ctx, insert, id, int64(len(payload)), payload); err != nil {
						_ = tx.Rollback()
						return err
					}
					return tx.Commit()
				}
			default:
				dedup := "INSERT INTO " + hand + " (consumer_group, event_id, created_at) VALUES ($1, $2, CURRENT_TIMESTAMP(6)) ON CONFLICT DO NOTHING"
				args := func(id string) []any { return []any{group, id} }
				if m == "hand-log" { // rmqtx's statement (consumer.Processor on PostgreSQL)
					dedup = "INSERT INTO " + logCopy + " (consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at) VALUES ($1, $2, $3, $4, 'SUCCESS', $5, statement_timestamp(), statement_timestamp()) ON CONFLICT (consumer_group, event_id) DO NOTHING"
					args = func(id string) []any { return []any{group, id, eventType, hash, 0} }
				}
				burn := time.Duration(0)
				if m == "hand-burn" {
					burn = time.Duration(*burnUS) * time.Microsecond
				}
				deadline := m == "hand-timeout"
				work = func(ctx context.Context, id string) error {
					if deadline {
						// A bounded transaction: the driver then watches the
						// context on every statement.
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
						defer cancel()
					}
					tx, err := db.BeginTxx(ctx, nil)
					if err != nil {
						return err
					}
					if _, err := tx.ExecContext(ctx, dedup, args(id)...); err != nil {
						_ = tx.Rollback()
						return err
					}
					if _, err := tx.ExecContext(ctx, insert, id, int64(len(payload)), payload); err != nil {
						_ = tx.Rollback()
						return err
					}
					if err := tx.Commit(); err != nil {
						return err
					}
					spin(burn)
					return nil
				}
			}
			var (
				next     atomic.Int64
				wg       sync.WaitGroup
				errMu    sync.Mutex
				firstErr error
			)
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			db0, self0, t0 := dbCPU(pm), selfCPU(), time.Now()
			for range *g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						k := next.Add(1)
						if k > int64(*n) {
							return
						}
						if err := work(ctx, eventID(tag, group, int(k))); err != nil {
							errMu.Lock()
							firstErr = cmp(firstErr, err)
							errMu.Unlock()
							return
						}
					}
				}()
			}
			wg.Wait()
			if firstErr != nil {
				return firstErr
			}
			el := time.Since(t0)
			f := figures{
				rate: float64(*n) / el.Seconds(),
				db:   float64((dbCPU(pm) - db0).Microseconds()) / float64(*n),
				self: float64((selfCPU() - self0).Microseconds()) / float64(*n),
			}
			runtime.ReadMemStats(&ms1)
			f.allocs = float64(ms1.Mallocs-ms0.Mallocs) / float64(*n)
			f.bytes = float64(ms1.TotalAlloc-ms0.TotalAlloc) / float64(*n)
			results[m] = append(results[m], f)
			fmt.Printf("round %2d %-9s %7.0f events/s  database %6.1f µs/event  pgcpu %6.1f µs/event  %5.1f allocs/event  %6.0f B/event\n",
				r+1, m, f.rate, f.db, f.self, f.allocs, f.bytes)
		}
	}
	fmt.Println("medians:")
	for _, m := range modes {
		fs := results[m]
		med := func(get func(figures) float64) float64 {
			v := make([]float64, len(fs))
			for i, f := range fs {
				v[i] = get(f)
			}
			return median(v)
		}
		line := fmt.Sprintf("  %-9s %7.0f events/s  database %6.1f µs/event  pgcpu %6.1f µs/event  %5.1f allocs/event  %6.0f B/event",
			m, med(func(f figures) float64 { return f.rate }), med(func(f figures) float64 { return f.db }), med(func(f figures) float64 { return f.self }),
			med(func(f figures) float64 { return f.allocs }), med(func(f figures) float64 { return f.bytes }))
		if base := modes[0]; m != base {
			h := results[base]
			paired := func(get func(figures) float64, ratio bool) (float64, int) {
				d := make([]float64, len(fs))
				higher := 0
				for i := range fs {
					if ratio {
						d[i] = get(fs[i]) / get(h[i])
					} else {
						d[i] = get(fs[i]) - get(h[i])
					}
					if (ratio && d[i] > 1) || (!ratio && d[i] > 0) {
						higher++
					}
				}
				return median(d), higher
			}
			dbD, dbN := paired(func(f figures) float64 { return f.db }, false)
			selfD, selfN := paired(func(f figures) float64 { return f.self }, false)
			rateR, _ := paired(func(f figures) float64 { return f.rate }, true)
			line += fmt.Sprintf("\n      against %s, paired medians of %d rounds: rate %.2fx, database %+.1f µs (higher in %d), pgcpu %+.1f µs (higher in %d)",
				base, len(fs), rateR, dbD, dbN, selfD, selfN)
		}
		fmt.Println(line)
	}
	return nil
}

// writeHeap writes the allocation profile (-memprofile): go tool pprof
// -sample_index=alloc_objects (or alloc_space) shows where each mode's
// allocations come from.
func writeHeap(file string) error {
	f, err := os.Create(filepath.Clean(file))
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	runtime.GC()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}

func eventID(tag, group string, k int) string { return fmt.Sprintf("%s-%s-%07d", tag, group, k) }

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// postmaster reads the postmaster's pid from its pid file.
func postmaster(file string) (int, error) {
	b, err := os.ReadFile(filepath.Clean(file))
	if err != nil {
		return 0, fmt.Errorf("the postmaster's pid (is PostgreSQL up, and this the project's root?): %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

// dbCPU is the postmaster's CPU with its backends' and background
// processes' (live, and reaped through the postmaster's cutime), or 0 when
// it cannot be read.
func dbCPU(pm int) time.Duration {
	d, _ := proccpu.TreeCPU(pm)
	return d
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// threadCPU is the calling thread's CPU time.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID
	_, _, _ = syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

var sink atomic.Uint64

// spin uses d of this thread's CPU (not of wall time: a preempted spin
// still costs d).
func spin(d time.Duration) {
	if d <= 0 {
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start, x := threadCPU(), sink.Load()
	for threadCPU()-start < d {
		for range 100 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	sink.Store(x)
}
