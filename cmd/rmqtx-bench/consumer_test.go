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

// The consumer workload, small, end to end on the real broker: every side
// drains every round, and the effect checks (each rmqtx side's business
// rows against its groups and events, the NoCrashCount sides included;
// the checked hand-written side's stored hashes against its payloads)
// pass. A check that counts the wrong sides prints CHECK FAILED, which
// this test fails on.
func TestConsumerWorkloadChecksPass(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, testConsumerWorkloadChecksPass)
}

func testConsumerWorkloadChecksPass(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := javaTestEnv(t, db)
	e.Opt.Messages, e.Opt.Rounds, e.Opt.Warmup = 64, 1, time.Millisecond
	w := runConsumer(ctx, e)
	require.Empty(t, w.Error)
	for _, s := range w.Sides {
		require.Len(t, s.Rounds, 1, s.Name)
		require.EqualValues(t, 64, s.Rounds[0].Count, s.Name)
	}
	require.NotNil(t, w.Side(sideFirstNoCount), "the NoCrashCount sides ran")
	for _, n := range w.Notes {
		require.NotContains(t, n, "CHECK FAILED")
		require.False(t, strings.HasPrefix(n, "rmqtx handler ran"), n)
	}
}
