package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// runChecked runs a workload small against db and requires that every side
// ran one round of want operations (any number when want is 0) and that no
// check of the workload failed: a check that counts the wrong rows prints
// CHECK FAILED, which fails the test.
func runChecked(t *testing.T, db *sqlx.DB, want int64, setup func(*Env), run func(context.Context, *Env) *Workload) *Workload {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := javaTestEnv(t, db)
	e.Opt.Rounds = 1
	setup(e)
	w := run(ctx, e)
	require.Empty(t, w.Error)
	for _, s := range w.Sides {
		require.Len(t, s.Rounds, 1, s.Name)
		require.Zero(t, s.Rounds[0].Errors, s.Name)
		if want > 0 {
			require.EqualValues(t, want, s.Rounds[0].Count, s.Name)
		} else {
			require.Positive(t, s.Rounds[0].Count, s.Name)
		}
	}
	for _, n := range w.Notes {
		require.False(t, strings.HasPrefix(n, "CHECK FAILED"), n)
	}
	return w
}

// The consumer workload, small, end to end on the real broker: every side
// drains every round, and the effect checks (each rmqtx side's business
// rows against its groups and events, the NoCrashCount sides and the
// raw-fed Processor sides included; the checked hand-written side's stored
// hashes against its payloads) pass.
func TestConsumerWorkloadChecksPass(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		w := runChecked(t, db, 64, func(e *Env) { e.Opt.Messages, e.Opt.Warmup = 64, time.Millisecond }, runConsumer)
		require.NotNil(t, w.Side(sideFirstNoCount), "the NoCrashCount sides ran")
		require.NotNil(t, w.Side(sideRawChecked), "the checked hand-written side ran")
		require.NotNil(t, w.Side(sideProcRaw), "the raw-fed Processor side ran")
		require.NotNil(t, w.Side(sideProcBatchRaw), "the raw-fed ProcessBatch side ran")
		for _, n := range w.Notes {
			require.False(t, strings.HasPrefix(n, "rmqtx handler ran"), n)
		}
	})
}

// The localtx workload, small, on both databases: every side runs, and the
// checks pass: one log row per business row in both transaction logs, and
// the row written by hand filled as rmqtx fills its own (a side that wrote
// another row would compare another cost).
func TestLocalTxWorkloadChecksPass(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		w := runChecked(t, db, 0, func(e *Env) { e.Opt.N, e.Opt.Warmup = 40, 0 }, runLocalTx)
		require.NotNil(t, w.Side(sideLocalRowByHand))
	})
}
