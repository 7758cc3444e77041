package txlog_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
)

// half is a committed row of id written by the local transaction of half h.
func half(id, h string) txlog.Row {
	r := committed(id)
	r.Properties = txlog.HalfProperties(h)
	return r
}

// rolledBack persists a local rollback of id by half h and returns its row.
func rolledBack(t *testing.T, s *txlog.Store, id, h string) txlog.Row {
	t.Helper()
	r := half(id, h)
	r.ResolvedBy = txlog.ByLocalRollback
	row, fenced, err := s.Fence(context.Background(), r)
	require.NoError(t, err)
	require.True(t, fenced)
	require.Equal(t, h, row.Half())
	return row
}

// retake runs Retake of id by half h in a transaction of its own and ends
// it with commit (or a rollback).
func retake(t *testing.T, s *txlog.Store, id, h string, startedAt time.Time, commit bool) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := s.DB().BeginTxx(ctx, nil)
	require.NoError(t, err)
	took, err := s.Retake(ctx, tx, half(id, h), startedAt)
	require.NoError(t, err)
	if commit {
		require.NoError(t, tx.Commit())
	} else {
		require.NoError(t, tx.Rollback())
	}
	return took
}

// A row that records a rollback for one half can be taken over by another
// half of the id, once: a committed row, the half the row names, a row that
// names no half, and a Send that began before the row was resolved are
// refused.
func TestRetake(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testRetake)
}

func testRetake(t *testing.T, db *sqlx.DB) {
	s := setupOn(t, db)
	ctx := context.Background()
	id := "rt-" + testenv.RandSuffix(8)
	first := rolledBack(t, s, id, "h1")

	require.False(t, retake(t, s, id, "h1", time.Now(), true), "the half the row names")
	require.False(t, retake(t, s, id, "h2", first.ResolvedAt.Add(-time.Millisecond), true), "a Send that began before the rollback")
	require.True(t, retake(t, s, id, "h2", time.Now(), false), "taken, then rolled back")
	row, err := s.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, txlog.StateRolledBack, row.State, "a rolled-back retake leaves the rollback")
	require.Equal(t, "h1", row.Half())

	require.True(t, retake(t, s, id, "h2", time.Now(), true))
	row, err = s.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Equal(t, "h2", row.Half())
	require.Equal(t, []byte("p"), row.Payload)
	require.False(t, retake(t, s, id, "h3", time.Now(), true), "a committed id is final")

	legacy := "rt-legacy-" + testenv.RandSuffix(6)
	_, _, err = s.Fence(ctx, txlog.Row{EventID: legacy, ProducerGroup: "g"})
	require.NoError(t, err)
	require.False(t, retake(t, s, legacy, "h2", time.Now(), true), "a row that names no half stays final")
}

// Fencing a half on a row rolled back for another half waits for a retake
// in flight: when the retake commits, the fence returns the committed row;
// when it rolls back, the fence raises resolved_at so that no Send begun
// before the fence can retake the id, and a later Send still can.
func TestFenceHalfWaitsForRetake(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testFenceHalfWaitsForRetake)
}

func testFenceHalfWaitsForRetake(t *testing.T, db *sqlx.DB) {
	s := setupOn(t, db)
	for _, commit := range []bool{true, false} {
		ctx := context.Background()
		id := "fh-" + testenv.RandSuffix(8)
		rolledBack(t, s, id, "h1")
		startedAt := time.Now()
		tx, err := s.DB().BeginTxx(ctx, nil)
		require.NoError(t, err)
		took, err := s.Retake(ctx, tx, half(id, "h2"), startedAt)
		require.NoError(t, err)
		require.True(t, took)

		type res struct {
			row txlog.Row
			err error
		}
		done := make(chan res, 1)
		go func() {
			r := half(id, "h2")
			r.ResolvedBy = txlog.ByFence
			row, _, err := s.Fence(ctx, r)
			done <- res{row, err}
		}()
		testenv.Eventually(t, 10*time.Second, "fence blocked on the retake's lock", func() bool {
			return blockedInserts(s.DB()) > 0
		})
		select {
		case r := <-done:
			t.Fatalf("fence returned while the retake holds the lock: %+v", r)
		default:
		}
		if commit {
			require.NoError(t, tx.Commit())
			r := <-done
			require.NoError(t, r.err)
			require.Equal(t, txlog.StateCommitted, r.row.State)
			require.Equal(t, "h2", r.row.Half())
			continue
		}
		require.NoError(t, tx.Rollback())
		r := <-done
		require.NoError(t, r.err)
		require.Equal(t, txlog.StateRolledBack, r.row.State)
		require.Equal(t, "h1", r.row.Half())
		require.False(t, r.row.ResolvedAt.Before(startedAt), "the fence raised resolved_at past the retake's start")
		require.False(t, retake(t, s, id, "h2", startedAt, true), "the fenced half can never retake the id")
		require.True(t, retake(t, s, id, "h3", time.Now(), true), "a Send begun after the fence can")
	}
}
