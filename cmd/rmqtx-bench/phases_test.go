package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func sample(half, local, end time.Duration) phaseSample {
	var s phaseSample
	s.ph[phHalf], s.ph[phLocal], s.ph[phEnd] = half, local, end
	s.total = half + local + end
	return s
}

func TestSummarizePhases(t *testing.T) {
	ms := time.Millisecond
	// 200 Sends of 2+1+0 ms, then 2 slow ones: one with a long half, one
	// with a long local transaction. p99 (nearest rank 199 of 202) is 3 ms,
	// so exactly the two slow Sends are the tail.
	var xs []phaseSample
	for i := 0; i < 200; i++ {
		xs = append(xs, sample(2*ms, 1*ms, 0))
	}
	xs = append(xs, sample(9*ms, 1*ms, 0), sample(2*ms, 7*ms, 1*ms))
	s := SummarizePhases(xs)
	if s.Samples != 202 || s.Tail != 2 || s.P99 != 3*ms {
		t.Fatalf("samples %d tail %d p99 %v", s.Samples, s.Tail, s.P99)
	}
	h, l, e := s.Phases[phHalf], s.Phases[phLocal], s.Phases[phEnd]
	if h.Name != "half" || h.P50 != 2*ms || h.P99 != 2*ms || l.P50 != 1*ms || e.P50 != 0 {
		t.Fatalf("percentiles: %+v %+v %+v", h, l, e)
	}
	// Shares: (0.9 + 0.2) / 2, (0.1 + 0.7) / 2, (0 + 0.1) / 2.
	for i, want := range []float64{0.55, 0.40, 0.05} {
		if got := s.Phases[i].TailShare; math.Abs(got-want) > 1e-9 {
			t.Errorf("%s share %v, want %v", phaseNames[i], got, want)
		}
	}
	m := map[string]float64{}
	s.Extras(m)
	if m["phase_half_tail_share"] != s.Phases[phHalf].TailShare || m["phase_local_p50_ms"] != 1 || m["phase_tail"] != 2 {
		t.Fatalf("extras %v", m)
	}
	if !strings.Contains(s.String(), "half 55%") {
		t.Fatalf("string %q", s.String())
	}
}

func TestSummarizePhasesNoTail(t *testing.T) {
	// Fewer than 100 Sends: p99 is the slowest, nothing is slower.
	s := SummarizePhases([]phaseSample{sample(time.Millisecond, time.Millisecond, 0)})
	if s.Tail != 0 || !math.IsNaN(s.Phases[phHalf].TailShare) {
		t.Fatalf("%+v", s)
	}
	m := map[string]float64{}
	s.Extras(m)
	if _, ok := m["phase_half_tail_share"]; ok {
		t.Fatal("share without a tail")
	}
	if e := SummarizePhases(nil); e.Samples != 0 || e.String() != "no phase samples" {
		t.Fatalf("%+v", e)
	}
}

func TestRawRecSample(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	r := rawRec{local0: at(3), pre: at(4), fn: at(6), commit: at(7)}
	if _, ok := r.sample(t0, at(8)); ok {
		t.Fatal("unstamped record sampled")
	}
	r.stamped = true
	s, ok := r.sample(t0, at(8))
	want := [nPhases]time.Duration{3, 4, 1, 1, 2, 1, 0}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !ok || s.total != 8*time.Millisecond || s.ph != want {
		t.Fatalf("%+v", s)
	}
	recs := make(rawRecs, 3)
	m := &primitive.Message{}
	recs[1].msg.Store(m)
	if recs.find(m) != &recs[1] || recs.find(&primitive.Message{}) != nil {
		t.Fatal("find")
	}
}

func TestPhaseLogTake(t *testing.T) {
	l := newPhaseLog(2)
	l.add(0, sample(1, 1, 1))
	l.add(1, sample(2, 2, 2))
	l.add(5, sample(3, 3, 3)) // out of range: dropped
	if got := l.take(); len(got) != 2 {
		t.Fatalf("took %d", len(got))
	}
	if got := l.take(); len(got) != 0 {
		t.Fatalf("took %d after take", len(got))
	}
}

func TestPhaseNotes(t *testing.T) {
	w := &Workload{Sides: []*Side{
		{Name: sideRawTxLog, Rounds: []Round{{Extra: map[string]float64{
			"phase_samples": 10, "phase_half_p50_ms": 2, "phase_half_p99_ms": 5, "phase_half_tail_share": 0.5,
			"pool_wait_count": 0, "pool_wait_ms": 0, "checks": 1,
		}}}},
	}}
	notes := strings.Join(phaseNotes(w, false), "\n")
	for _, want := range []string{"phases raw tx producer + txlog", "half 2.00/5.00", "half 50%", "0/0.0ms", "raw tx producer + txlog: 1", "-phases"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

func TestSpanRecSample(t *testing.T) {
	t0 := time.Unix(100, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	span := func(name string, a, b int) sdktrace.ReadOnlySpan {
		return tracetest.SpanStub{Name: name, StartTime: at(a), EndTime: at(b)}.Snapshot()
	}
	// Send 0-10 ms: set-up 0-1, half 1-4, local 4-9 (waits for the early
	// transaction until 5, fn 5-7, COMMIT 7-9), end 9-10.
	rec := spanRec{send: span("s", 0, 10), half: span("h", 1, 4), local: span("l", 4, 9), fn0: at(5), fn1: at(7)}
	s, ok := rec.sample()
	want := [nPhases]time.Duration{3, 5, 2, 1, 2, 2, 1}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !ok || s.total != 10*time.Millisecond || s.ph != want {
		t.Fatalf("%+v", s)
	}
	rec.reset()
	if _, ok := rec.sample(); ok {
		t.Fatal("empty record sampled")
	}
}
