package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// A preload that needs more than the free space fails before it starts,
// with the figures; one that fits passes.
func TestScaleDiskVerdict(t *testing.T) {
	err := diskVerdict(10_000_000, 10e9, "/data")
	require.ErrorContains(t, err, "preload of 10M rows needs about 30.0 GB free on the database's disk (/data), 10.0 GB free")
	require.NoError(t, diskVerdict(1_000_000, 100e9, "/data"))
	require.NoError(t, diskVerdict(0, 0, "/data"), "nothing to preload")
}

// On both real databases the check finds the data directory and reads its
// free space: an impossible preload is refused, a small one passes, and
// neither says the check was skipped.
func TestScaleDiskChecksTheDataDirectory(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		e := javaTestEnv(t, db)
		engine, addr := e.S.Engine, e.S.DBAddr()
		var logs []string
		logf := func(f string, a ...any) { logs = append(logs, fmt.Sprintf(f, a...)) }
		ctx := context.Background()
		require.NoError(t, checkScaleDisk(ctx, db, engine, addr, 1000, logf))
		require.ErrorContains(t, checkScaleDisk(ctx, db, engine, addr, 1<<50, logf), "free space or choose fewer rows")
		require.Empty(t, logs, "the check ran")
	})
}
