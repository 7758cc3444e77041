package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func durs(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Millisecond
	}
	return out
}

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Duration(0), Percentile(nil, 50))
	one := durs(7)
	require.Equal(t, 7*time.Millisecond, Percentile(one, 50))
	require.Equal(t, 7*time.Millisecond, Percentile(one, 99))

	// 1..100 ms: the p-th percentile by nearest rank is p ms.
	var hundred []int
	for i := 1; i <= 100; i++ {
		hundred = append(hundred, i)
	}
	s := durs(hundred...)
	require.Equal(t, 50*time.Millisecond, Percentile(s, 50))
	require.Equal(t, 99*time.Millisecond, Percentile(s, 99))
	require.Equal(t, 100*time.Millisecond, Percentile(s, 100))
	require.Equal(t, 1*time.Millisecond, Percentile(s, 0))
	require.Equal(t, 1*time.Millisecond, Percentile(s, 0.5))

	// Four values: p50 is the 2nd (ceil(2)), p99 the 4th, p26 the 2nd.
	four := durs(10, 20, 30, 40)
	require.Equal(t, 20*time.Millisecond, Percentile(four, 50))
	require.Equal(t, 40*time.Millisecond, Percentile(four, 99))
	require.Equal(t, 20*time.Millisecond, Percentile(four, 26))
	require.Equal(t, 10*time.Millisecond, Percentile(four, 25))
}

func TestMedian(t *testing.T) {
	t.Parallel()
	require.True(t, math.IsNaN(Median(nil)))
	require.Equal(t, 3.0, Median([]float64{5, 1, 3}))
	require.Equal(t, 2.5, Median([]float64{4, 1, 2, 3}))
	in := []float64{3, 1, 2}
	_ = Median(in)
	require.Equal(t, []float64{3, 1, 2}, in, "Median must not reorder its input")
}

func side(name string, rates ...float64) *Side {
	s := &Side{Name: name, Unit: "tx/s"}
	for i, r := range rates {
		s.Rounds = append(s.Rounds, Round{Index: i + 1, Count: int64(r), Seconds: 1, Rate: r, P50Ms: float64(i + 1), P99Ms: float64(10 * (i + 1))})
	}
	s.Summarize()
	return s
}

func TestSummarizeTakesMedians(t *testing.T) {
	t.Parallel()
	s := side("a", 100, 300, 200)
	require.Equal(t, 200.0, s.Rate)
	require.Equal(t, 2.0, s.P50Ms)
	require.Equal(t, 20.0, s.P99Ms)
	require.Equal(t, 1.0, s.Seconds)
}

func TestRatioPairsRoundsAndChecksTarget(t *testing.T) {
	t.Parallel()
	raw := side("raw", 1000, 800, 1200)
	tx := side("tx", 950, 700, 1300)
	r := NewRatio("tx/raw", tx, raw, 0.90)
	// Per round: 0.95, 0.875, 1.0833 -> median 0.95.
	require.Len(t, r.Rounds, 3)
	require.InDelta(t, 0.95, r.Value, 1e-9)
	require.NotNil(t, r.Target)
	require.Equal(t, "met", r.Verdict())

	miss := NewRatio("tx/raw", side("tx", 800, 700, 1000), raw, 0.90)
	require.InDelta(t, 0.833333, miss.Value, 1e-5)
	require.Equal(t, "missed", miss.Verdict())

	none := NewRatio("x", tx, raw, 0)
	require.Nil(t, none.Target)
	require.Nil(t, none.Met)
	require.Equal(t, "", none.Verdict())

	// A zero-rate denominator round is left out; no rounds at all gives NaN.
	zero := NewRatio("z", tx, side("zero", 0, 0, 0), 2)
	require.True(t, math.IsNaN(zero.Value))
	require.Nil(t, zero.Met)
}

func TestReportJSONHasEveryFigureAndRatio(t *testing.T) {
	t.Parallel()
	w := &Workload{Name: "producer", Sides: []*Side{side(sideRawTx, 1000, 1000), side(sideRmqtxSend, 950, 930), side(sideRawSendSync, 2000, 2000)}}
	addRatios(w)
	empty := &Workload{Name: "consumer", Sides: []*Side{{Name: sideRawHandler, Skipped: "not built"}}}
	addRatios(empty)
	rep := &Report{StartedAt: time.Unix(0, 0), Machine: Machine{Cores: 2, MemoryBytes: 1 << 30, GoVersion: "go1.x", BrokerVersion: "5.3.3"},
		Settings: map[string]string{"concurrency": "8"}, Workloads: []*Workload{w, empty}}
	rep.Finish()
	require.Equal(t, 1, rep.TargetsAll)
	require.Equal(t, 1, rep.TargetsMet)

	var buf bytes.Buffer
	require.NoError(t, rep.WriteJSON(&buf))
	var back struct {
		Machine   Machine `json:"machine"`
		Workloads []struct {
			Name   string `json:"name"`
			Sides  []Side `json:"sides"`
			Ratios []struct {
				Name   string    `json:"name"`
				Value  *float64  `json:"value"`
				Rounds []float64 `json:"rounds"`
				Target *float64  `json:"target"`
				Met    *bool     `json:"met"`
			} `json:"ratios"`
		} `json:"workloads"`
		TargetsMet int `json:"targets_met"`
	}
	require.NoError(t, json.Unmarshal(buf.Bytes(), &back), buf.String())
	require.Equal(t, 2, back.Machine.Cores)
	require.Equal(t, "5.3.3", back.Machine.BrokerVersion)
	require.Len(t, back.Workloads, 2)
	p := back.Workloads[0]
	require.Len(t, p.Sides, 3)
	require.Equal(t, 1000.0, p.Sides[0].Rate)
	require.Len(t, p.Sides[0].Rounds, 2)
	require.Len(t, p.Ratios, 3)
	require.Equal(t, "rmqtx Send / raw tx producer (tx/s)", p.Ratios[0].Name)
	require.InDelta(t, 0.94, *p.Ratios[0].Value, 1e-9)
	require.Equal(t, 0.90, *p.Ratios[0].Target)
	require.True(t, *p.Ratios[0].Met)
	require.Nil(t, p.Ratios[1].Target)
	require.Empty(t, back.Workloads[1].Ratios, "no ratio without measured sides")

	// A NaN ratio is written as null, not an encoding error.
	nan := Ratio{Name: "n", Value: math.NaN()}
	b, err := json.Marshal(nan)
	require.NoError(t, err)
	require.Contains(t, string(b), `"value":null`)

	var tbl bytes.Buffer
	rep.WriteTable(&tbl)
	out := tbl.String()
	require.Contains(t, out, "rmqtx Send / raw tx producer (tx/s)")
	require.Contains(t, out, "0.94x")
	require.Contains(t, out, "target >= 0.90x: met")
	require.Contains(t, out, "skipped: not built")
	require.Contains(t, out, "targets met: 1 of 1")
}

func TestRotate(t *testing.T) {
	t.Parallel()
	s := []string{"a", "b", "c"}
	require.Equal(t, []string{"a", "b", "c"}, rotate(s, 0))
	require.Equal(t, []string{"b", "c", "a"}, rotate(s, 1))
	require.Equal(t, []string{"c", "a", "b"}, rotate(s, 2))
	require.Equal(t, []string{"a", "b", "c"}, rotate(s, 3))
	require.Equal(t, []string{"b", "a"}, rotate([]string{"a", "b"}, 1))
	require.Nil(t, rotate(nil, 1))
}

func TestRunLoopCountsAndBounds(t *testing.T) {
	t.Parallel()
	// Count-bounded: exactly n operations start, errors are not counted.
	boom := errors.New("boom")
	res := RunLoop(context.Background(), 4, 0, 100, func(_ context.Context, _ int, seq int64) error {
		if seq%10 == 0 {
			return boom
		}
		return nil
	})
	require.Equal(t, int64(90), res.Count)
	require.Equal(t, int64(10), res.Errors)
	require.ErrorIs(t, res.FirstErr, boom)
	require.Len(t, res.Latencies, 90)
	for i := 1; i < len(res.Latencies); i++ {
		require.LessOrEqual(t, res.Latencies[i-1], res.Latencies[i])
	}
	ro := res.Round(1)
	require.Equal(t, int64(90), ro.Count)
	require.Greater(t, ro.Rate, 0.0)

	// Context-bounded: a cancelled context stops the loop.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res = RunLoop(ctx, 2, time.Hour, 0, func(context.Context, int, int64) error { return nil })
	require.Equal(t, int64(0), res.Count)
}

// Paced (-rate): the operations of all goroutines start no faster than the
// rate, and an operation's time leaves out its wait for its turn.
func TestRunLoopPacedHoldsTheRate(t *testing.T) {
	t.Parallel()
	const n, perSecond = 41, 200.0
	res := RunLoopPaced(context.Background(), 4, 0, n, perSecond, func(context.Context, int, int64) error { return nil })
	require.Equal(t, int64(n), res.Count)
	// The limiter (burst 1) lets the first start at once and each next one
	// 1/200 s later: 40 gaps of 5 ms.
	require.GreaterOrEqual(t, res.Elapsed, 195*time.Millisecond, "41 operations at 200 a second take 200 ms")
	require.Less(t, res.Latencies[len(res.Latencies)-1], res.Elapsed/2, "no operation's time holds the waits")

	// Unpaced, the same run takes no 5 ms gaps.
	fast := RunLoopPaced(context.Background(), 4, 0, n, 0, func(context.Context, int, int64) error { return nil })
	require.Equal(t, int64(n), fast.Count)
	require.Less(t, fast.Elapsed, res.Elapsed)

	// A context that ends stops a paced loop waiting for its turn.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	slow := RunLoopPaced(ctx, 2, time.Hour, 0, 1, func(context.Context, int, int64) error { return nil })
	require.LessOrEqual(t, slow.Count, int64(1), "one a second: at most the first starts in 50 ms")
}

// A workload whose sides were paced judges no target on their ratios and
// says so; ratios between unpaced sides keep theirs.
func TestUnjudgePaced(t *testing.T) {
	t.Parallel()
	side := func(name string, paced float64, rate float64) *Side {
		return &Side{Name: name, Unit: "tx/s", Paced: paced, Rounds: []Round{{Index: 1, Count: 10, Rate: rate}}}
	}
	w := &Workload{Name: "producer", Sides: []*Side{side("a", 500, 500), side("b", 500, 499), side("c", 0, 900), side("d", 0, 300)}}
	w.AddRatio("a / b", "a", "b", 1.05)
	w.AddRatio("c / d", "c", "d", 0.90)
	w.AddRatio("a / c", "a", "c", 0)
	w.UnjudgePaced()
	require.Len(t, w.Ratios, 3)
	require.Nil(t, w.Ratios[0].Target)
	require.Nil(t, w.Ratios[0].Met)
	require.Empty(t, w.Ratios[0].Verdict())
	require.NotNil(t, w.Ratios[1].Target, "no side of c / d was paced")
	require.Equal(t, "met", w.Ratios[1].Verdict())
	require.Len(t, w.Notes, 1)
	require.Contains(t, w.Notes[0], "at most 500 operations a second each): 1 ratios judge no target")

	unpaced := &Workload{Name: "producer", Sides: []*Side{side("c", 0, 900), side("d", 0, 300)}}
	unpaced.AddRatio("c / d", "c", "d", 0.90)
	unpaced.UnjudgePaced()
	require.Empty(t, unpaced.Notes)
	require.NotNil(t, unpaced.Ratios[0].Target)
}

func TestMakePayloadSizeAndDistinct(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 16, 512, 4096} {
		require.Len(t, makePayload(n, 42), n)
	}
	require.NotEqual(t, makePayload(512, 1), makePayload(512, 2))
	require.True(t, strings.HasSuffix(string(makePayload(64, 3)), `"}`))
}

func TestRunRejectsBadFlags(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	require.Equal(t, 2, run([]string{"-workloads", "nope"}, &out, &errb))
	require.Contains(t, errb.String(), "unknown workload")
	errb.Reset()
	require.Equal(t, 2, run([]string{"-concurrency", "0"}, &out, &errb))
	errb.Reset()
	require.Equal(t, 2, run([]string{"-cpu-split-dir", t.TempDir()}, &out, &errb))
	require.Contains(t, errb.String(), "-cpu-split-dir needs -cpu-split")
	errb.Reset()
	require.Equal(t, 2, run([]string{"-rate", "-1"}, &out, &errb))
	require.Contains(t, errb.String(), "-rate must be a number >= 0")
	errb.Reset()
	require.Equal(t, 2, run([]string{"-rate", "NaN"}, &out, &errb))
	require.Contains(t, errb.String(), "-rate must be a number >= 0")
	errb.Reset()
	require.Equal(t, 2, run([]string{"-rate", "500", "-java"}, &out, &errb))
	require.Contains(t, errb.String(), "-rate cannot pace the Java sides")
}
