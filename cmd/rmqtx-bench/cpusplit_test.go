package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/require"
)

// synthProfile builds a CPU profile as runtime/pprof writes one (samples
// and cpu nanoseconds per stack, 10 ms period; withCPU false: samples
// only). A stack is leaf first; a frame "a|b" is one location where a is
// inlined into b (Line[0] = a, the innermost); "fn@file" sets the file.
type synthStack struct {
	frames []string
	n      int64 // samples
}

func synthProfile(t *testing.T, stacks []synthStack, withCPU bool) *profile.Profile {
	t.Helper()
	const period = int64(10 * time.Millisecond)
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "samples", Unit: "count"}},
		PeriodType: &profile.ValueType{Type: "cpu", Unit: "nanoseconds"},
		Period:     period,
	}
	if withCPU {
		p.SampleType = append(p.SampleType, &profile.ValueType{Type: "cpu", Unit: "nanoseconds"})
	}
	funcs := map[string]*profile.Function{}
	fn := func(spec string) *profile.Function {
		if f, ok := funcs[spec]; ok {
			return f
		}
		name, file, _ := strings.Cut(spec, "@")
		if file == "" {
			file = "/src/" + name + ".go"
		}
		f := &profile.Function{ID: uint64(len(p.Function) + 1), Name: name, SystemName: name, Filename: file}
		p.Function = append(p.Function, f)
		funcs[spec] = f
		return f
	}
	for _, st := range stacks {
		s := &profile.Sample{Value: []int64{st.n}}
		if withCPU {
			s.Value = append(s.Value, st.n*period)
		}
		for _, frame := range st.frames {
			loc := &profile.Location{ID: uint64(len(p.Location) + 1), Address: uint64(0x1000 + len(p.Location))}
			for _, spec := range strings.Split(frame, "|") {
				loc.Line = append(loc.Line, profile.Line{Function: fn(spec), Line: 1})
			}
			p.Location = append(p.Location, loc)
			s.Location = append(s.Location, loc)
		}
		p.Sample = append(p.Sample, s)
	}
	require.NoError(t, p.CheckValid())
	// Through the wire format, as a round's profile goes.
	var b bytes.Buffer
	require.NoError(t, p.Write(&b))
	q, err := profile.Parse(&b)
	require.NoError(t, err)
	return q
}

// Every sample goes to the first known frame from the leaf up, inlined
// frames included, innermost first.
func TestCPUSplitAttribution(t *testing.T) {
	t.Parallel()
	stacks := []synthStack{
		// The driver's syscall under rmqtx's Send: the driver's.
		{[]string{"syscall.Syscall", "net.(*conn).Write", "github.com/go-sql-driver/mysql.(*mysqlConn).writePacket",
			"database/sql.(*Tx).ExecContext", "github.com/jmoiron/sqlx.(*Tx).ExecContext", "github.com/rmqtx/rmqtx/txproducer.(*Producer).Send",
			"main.RunLoop.func1", "runtime.goexit"}, 7},
		// pgx and its pool are the driver too.
		{[]string{"runtime.memmove", "github.com/jackc/pgx/v5/pgconn.(*PgConn).Exec", "github.com/jackc/pgx/v5/stdlib.(*Conn).ExecContext"}, 2},
		{[]string{"github.com/jackc/puddle/v2.(*Pool).Acquire"}, 1},
		// An allocation made by rmqtx is rmqtx's.
		{[]string{"runtime.mallocgc", "github.com/rmqtx/rmqtx/txlog.(*Store).Insert", "database/sql.(*Tx).ExecContext"}, 5},
		// A library reached through the client is the client's.
		{[]string{"encoding/json.Marshal", "github.com/json-iterator/go.(*Stream).Write",
			"github.com/apache/rocketmq-client-go/v2/internal/remote.(*remotingClient).InvokeSync",
			"github.com/rmqtx/rmqtx/txproducer.(*Producer).Send"}, 11},
		// The patched copy: by import path under the module, or by file.
		{[]string{"github.com/rmqtx/rmqtx/third_party/rocketmq-client-go/primitive.F"}, 1},
		{[]string{"runtime.memclr", "example.com/vendored/remote.F@/work/main/third_party/rocketmq-client-go/internal/remote/remote_client.go"}, 1},
		// Inlined: wire.NewEventID inlined into the bench's op is rmqtx's;
		// the bench's own frame comes after it in the location.
		{[]string{"crypto/rand.Read", "github.com/rmqtx/rmqtx/wire.NewEventID|main.rmqtxSendSide.func3"}, 3},
		// The bench: package main in the binary, its import path in tests.
		{[]string{"crypto/sha1.block", "github.com/google/uuid.NewSHA1", "main.keyedEventID"}, 4},
		{[]string{"github.com/rmqtx/rmqtx/cmd/rmqtx-bench.RunLoop.func1"}, 2},
		// No known frame: GC, scheduler.
		{[]string{"runtime.scanobject", "runtime.gcBgMarkWorker", "runtime.goexit"}, 6},
		{[]string{"runtime.findRunnable", "runtime.schedule"}, 1},
	}
	wantParts := []string{partSQL, partSQL, partSQL, partRmqtx, partClient, partClient, partClient, partRmqtx, partBench, partBench, partOther, partOther}
	for _, withCPU := range []bool{true, false} { // false: samples × period
		p := synthProfile(t, stacks, withCPU)
		require.Len(t, p.Sample, len(stacks))
		want := map[string]time.Duration{}
		for i, s := range p.Sample {
			require.Equal(t, wantParts[i], samplePart(s), "stack %d: %v", i, stacks[i].frames)
			want[wantParts[i]] += time.Duration(stacks[i].n) * 10 * time.Millisecond
		}
		got, n, err := splitProfile(p)
		require.NoError(t, err)
		require.Equal(t, int64(44), n)
		require.Equal(t, want, got)
		require.Equal(t, map[string]time.Duration{
			partSQL: 100 * time.Millisecond, partRmqtx: 80 * time.Millisecond, partClient: 130 * time.Millisecond,
			partBench: 60 * time.Millisecond, partOther: 70 * time.Millisecond,
		}, got)
	}
	_, _, err := splitProfile(&profile.Profile{SampleType: []*profile.ValueType{{Type: "alloc_space", Unit: "bytes"}}})
	require.Error(t, err, "a profile that is not a CPU profile")
}

// Per-tx figures are the parts over the committed operations; the side's
// figures are per-column medians over rounds; the table prints them and
// "-" for a server that was not measured.
func TestCPUSplitTableMath(t *testing.T) {
	t.Parallel()
	side := &Side{Name: sideRmqtxSend, Unit: "tx/s"}
	// Three rounds of 1000 committed Sends; the database measured in two.
	for i, k := range []time.Duration{1, 3, 2} {
		parts := map[string]time.Duration{
			partRmqtx: k * 10 * time.Millisecond, partClient: k * 20 * time.Millisecond, partSQL: k * 30 * time.Millisecond,
			partBench: k * 5 * time.Millisecond, partOther: k * 15 * time.Millisecond,
		}
		srv := cpuSample{broker: k * 40 * time.Millisecond, brokerOK: true, db: k * 50 * time.Millisecond, dbOK: i != 1,
			brokerNet: k * 25 * time.Millisecond, brokerNetOK: true, dbSessions: k * 30 * time.Millisecond, dbSessionsOK: i != 1}
		r := Round{Index: i + 1, Count: 1000, Extra: map[string]float64{"checks": 0}}
		addCPUSplit(r.Extra, parts, srv, k*82*time.Millisecond, r.Count)
		r.Extra[extraCPUSamples] = float64(k * 8)
		side.Rounds = append(side.Rounds, r)
	}
	r0 := side.Rounds[0].Extra
	require.InDelta(t, 10.0, r0[extraCPUPart(partRmqtx)], 1e-9) // 10 ms / 1000 tx = 10 µs
	require.InDelta(t, 30.0, r0["cpu_us_per_tx_sql_driver"], 1e-9)
	require.InDelta(t, 15.0, r0["cpu_us_per_tx_runtime_other"], 1e-9)
	require.InDelta(t, 40.0, r0[extraCPUBroker], 1e-9)
	require.InDelta(t, 50.0, r0[extraCPUDatabase], 1e-9)
	require.InDelta(t, 25.0, r0[extraCPUBrokerNet], 1e-9)
	require.InDelta(t, 30.0, r0[extraCPUDBSessions], 1e-9)
	require.InDelta(t, 170.0, r0[extraCPUTotal], 1e-9) // 10+20+30+5+15 + 40 + 50: the parts of the servers are in their figures
	require.InDelta(t, 82.0, r0[extraCPUProcess], 1e-9)
	require.NotContains(t, side.Rounds[1].Extra, extraCPUDatabase)
	require.NotContains(t, side.Rounds[1].Extra, extraCPUDBSessions)
	require.InDelta(t, 360.0, side.Rounds[1].Extra[extraCPUTotal], 1e-9) // 3×(80+40), no database

	summarizeCPUSplit(side)
	c := side.CPUSplit
	require.NotNil(t, c)
	require.Equal(t, 3, c.Rounds)
	require.InDelta(t, 20.0, c.Rmqtx, 1e-9) // median of 10, 30, 20
	require.InDelta(t, 40.0, c.Client, 1e-9)
	require.InDelta(t, 60.0, c.SQL, 1e-9)
	require.InDelta(t, 10.0, c.Bench, 1e-9)
	require.InDelta(t, 30.0, c.RuntimeOther, 1e-9)
	require.InDelta(t, 80.0, *c.Broker, 1e-9)
	require.InDelta(t, 75.0, *c.Database, 1e-9) // median of 50 and 100
	require.InDelta(t, 50.0, *c.BrokerNetwork, 1e-9)
	require.InDelta(t, 45.0, *c.DatabaseSessions, 1e-9) // median of 30 and 60
	require.InDelta(t, 340.0, c.Total, 1e-9)            // median of 170, 360, 340
	require.InDelta(t, 164.0, c.ProcessRusage, 1e-9)
	require.InDelta(t, 16.0, c.Samples, 1e-9)

	bare := &Side{Name: sideRawTx, Rounds: []Round{{Count: 10}}}
	summarizeCPUSplit(bare)
	require.Nil(t, bare.CPUSplit, "no round has a split")
	noSrv := &Side{Name: sideRawTxLog, Rounds: []Round{{Count: 10, Extra: map[string]float64{}}}}
	addCPUSplit(noSrv.Rounds[0].Extra, map[string]time.Duration{partBench: time.Millisecond}, cpuSample{}, time.Millisecond, 10)
	summarizeCPUSplit(noSrv)
	require.Nil(t, noSrv.CPUSplit.Broker)
	require.Nil(t, noSrv.CPUSplit.Database)
	require.Nil(t, noSrv.CPUSplit.BrokerNetwork)
	require.Nil(t, noSrv.CPUSplit.DatabaseSessions)
	require.InDelta(t, 100.0, noSrv.CPUSplit.Total, 1e-9)

	var b strings.Builder
	writeCPUSplitTable(&b, "  ", []*Side{side, bare, noSrv})
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	require.Len(t, lines, 3, b.String())
	require.Equal(t, []string{"cpu", "split", "per", "op", "(µs):", "side", "rmqtx", "client", "sql+driver", "bench", "runtime/other", "broker", "(net)", "database", "(sess.)", "total"},
		strings.Fields(lines[0]))
	require.Equal(t, []string{"20", "40", "60", "10", "30", "80", "50", "75", "45", "340"}, strings.Fields(strings.TrimPrefix(strings.TrimSpace(lines[1]), sideRmqtxSend)))
	require.Equal(t, []string{"0", "0", "0", "100", "0", "-", "-", "-", "-", "100"}, strings.Fields(strings.TrimPrefix(strings.TrimSpace(lines[2]), sideRawTxLog)))

	// The report's table carries it too, and the JSON field is omitted
	// without a split.
	w := &Workload{Name: "producer", Sides: []*Side{side, bare}}
	var tbl bytes.Buffer
	(&Report{Workloads: []*Workload{w}}).WriteTable(&tbl)
	require.Contains(t, tbl.String(), "cpu split per op (µs)")
	var js bytes.Buffer
	require.NoError(t, (&Report{Workloads: []*Workload{{Name: "producer", Sides: []*Side{bare}}}}).WriteJSON(&js))
	require.NotContains(t, js.String(), "cpu_split")
	require.Len(t, cpuSplitNotes(w), 4)
	require.Empty(t, cpuSplitNotes(&Workload{Sides: []*Side{bare}}))
}

// spin burns CPU in a function of this package until the process has used
// d more CPU time.
func spin(d time.Duration) uint64 {
	var m cpuMeter
	end := m.sample().self + d
	x := uint64(1)
	for m.sample().self < end {
		for i := 0; i < 100000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	return x
}

// A real round: the splitter profiles the window between begin and finish
// and charges this package's busy loop to the bench. (In a test binary the
// package's functions carry its import path instead of "main.".)
func TestCPUSplitProfilesARound(t *testing.T) {
	s := &cpuSplitter{} // no broker or database process: those columns stay out
	w := &Workload{Name: "producer"}
	s.begin(w)
	require.Empty(t, w.Notes)
	require.True(t, s.on)
	sink := spin(300 * time.Millisecond)
	r := Round{Count: 100}
	s.finish(w, &r)
	require.Empty(t, w.Notes)
	require.NotZero(t, sink)
	require.NotContains(t, r.Extra, extraCPUBroker)
	require.NotContains(t, r.Extra, extraCPUDatabase)
	bench := r.Extra[extraCPUPart(partBench)]
	var sum float64
	for _, part := range cpuParts {
		sum += r.Extra[extraCPUPart(part)]
	}
	require.InDelta(t, sum, r.Extra[extraCPUTotal], 1e-6)
	// 300 ms over 100 ops is 3000 µs/op of busy loop; the profile samples
	// at 100 Hz, so allow for sampling error and other goroutines.
	require.Greater(t, bench, 0.8*sum, "extras %v", r.Extra)
	require.Greater(t, bench, 2000.0, "extras %v", r.Extra)
	require.GreaterOrEqual(t, r.Extra[extraCPUProcess], 3000.0, "getrusage covers the loop")
	require.GreaterOrEqual(t, r.Extra[extraCPUSamples], 20.0, "300 ms at 100 Hz")

	// A second profile cannot start while one runs: the round is left
	// without a split and the workload says why, once.
	s.begin(w)
	o := &cpuSplitter{}
	o.begin(w)
	o.begin(w)
	require.Len(t, w.Notes, 1)
	require.Contains(t, w.Notes[0], "cpu split:")
	o.finish(w, &Round{Count: 1})
	s.finish(w, &Round{Count: 1})
}

// -cpu-split-dir: save writes the last finished round's profile under the
// side's name, once; a round that was not profiled writes nothing.
func TestCPUSplitSavesRoundProfile(t *testing.T) {
	dir := t.TempDir()
	s := &cpuSplitter{dir: dir}
	w := &Workload{Name: "consumer"}
	s.begin(w)
	require.NotZero(t, spin(100*time.Millisecond))
	s.finish(w, &Round{Count: 10})
	s.save(w, "rmqtx first delivery, NoCrashCount", 2)
	s.save(w, "raw handler", 2) // nothing finished since the last save
	require.Empty(t, w.Notes)

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
	require.Equal(t, "consumer-rmqtx-first-delivery-nocrashcount-r2.pprof", entries[0].Name())
	f, err := os.Open(filepath.Join(dir, entries[0].Name()))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	p, err := profile.Parse(f)
	require.NoError(t, err)
	require.NotEmpty(t, p.Sample, "100 ms of busy loop at 100 Hz")

	var none *cpuSplitter // without -cpu-split
	none.save(w, "raw handler", 1)
	require.Equal(t, "raw-batch-handler-no-dedup", profileSlug("raw batch handler (no dedup)"))
	require.Equal(t, "rmqtx-duplicate-hit-cold-db", profileSlug("rmqtx duplicate hit, cold (DB)"))
}
