package consumer

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// The consumer's dedup commit behind a black hole (testenv.DBHole: the
// sockets stay open, nothing flows, no reset), on the real broker and both
// databases. The consumer's pool goes through the proxy; its handler writes
// one effect row per committed run (the effect table has no unique key, so
// a second effect would show). Each test ends with one effect per event,
// nothing lost and no dead letter.

// holeBed is one black-hole test's world: a consumer whose pool goes
// through hole, a raw publisher, and the events published so far.
type holeBed struct {
	db     *sqlx.DB // direct, for reading and for ending sessions
	hole   *testenv.DBHole
	c      *Consumer
	pb     *publisher
	topic  string
	target string
	runs   runCounter
}

// holeProcessTimeout bounds the transaction of one message, and on
// MariaDB the driver's readTimeout: the client's own wait for an answer
// the black hole keeps.
const holeProcessTimeout = 5 * time.Second

func newHoleBed(t *testing.T, db *sqlx.DB, inHandler func(b *holeBed)) *holeBed {
	b := &holeBed{db: db, hole: testenv.NewDBHole(t, db), pb: newPublisher(t), topic: testenv.Name(t, "topic"), target: wire.NewEventID()}
	testenv.CreateTopic(t, b.topic, 1)
	var fired atomic.Bool
	handler := func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
		b.runs.add(ev.ID)
		if err := effectHandler(ctx, tx, ev); err != nil {
			return err
		}
		if ev.ID == b.target && fired.CompareAndSwap(false, true) {
			inHandler(b)
		}
		return nil
	}
	b.c = startConsumer(t, b.hole.Pool(t, holeProcessTimeout), b.topic, testenv.Name(t, "grp"),
		map[string]Route{"Created": {Handler: handler}}, func(c *Config) { c.ProcessTimeout = holeProcessTimeout })
	t.Cleanup(b.hole.Cut) // before the consumer's Shutdown, should the test stop early
	return b
}

// publishApplied publishes a fresh event and waits until its effect is
// committed: everything before it on the one-queue topic was consumed.
func (b *holeBed) publishApplied(t *testing.T) string {
	t.Helper()
	id := wire.NewEventID()
	b.pb.send(b.topic, ev(id, "Created"), []byte(`{"n":1}`))
	testenv.Eventually(t, 60*time.Second, "event "+id+" applied", func() bool { return b.effects(t, id) == 1 })
	return id
}

func (b *holeBed) effects(t *testing.T, id string) int {
	return countRows(t, b.db, "SELECT COUNT(*) FROM effect WHERE event_id = ?", id)
}

// settled asserts one effect per event and no dead letter.
func (b *holeBed) settled(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		require.Equal(t, 1, b.effects(t, id), "effects of %s", id)
	}
	require.Equal(t, len(ids), effects(t, b.db), "effects in all")
	require.Zero(t, countRows(t, b.db, "SELECT COUNT(*) FROM "+DefaultPrefix+DeadLetterTable), "dead letters")
	require.Equal(t, 1, countRows(t, b.db, "SELECT COUNT(*) FROM "+DefaultPrefix+ConsumeLogTable+" WHERE event_id = ?", b.target))
}

// The connection black-holes inside the transaction, after the handler's
// effect: the COMMIT never reaches the server, which keeps the session, the
// dedup row's lock and the uncommitted effect. The partition then heals for
// new sessions (testenv's Restore) while the server keeps the old one: the
// consumer's wait ends at its own timeout, the message is redelivered and
// its dedup statement meets the old session's lock, so nothing is decided
// while the server keeps it. Once the server ends the session (KILL
// CONNECTION / pg_terminate_backend, as its timeout would), the old
// transaction is rolled back and the redelivery applies the event: one
// effect.
func TestBlackHoleBeforeDedupCommit(t *testing.T) {
	t.Parallel()
	eachDB(t, testBlackHoleBeforeDedupCommit)
}

func testBlackHoleBeforeDedupCommit(t *testing.T, db *sqlx.DB) {
	holed := make(chan struct{})
	b := newHoleBed(t, db, func(b *holeBed) {
		b.hole.BlackHole() // the COMMIT that follows goes nowhere
		close(holed)
	})
	before := b.publishApplied(t)
	started := time.Now()
	b.pb.send(b.topic, ev(b.target, "Created"), []byte(`{"n":1}`))
	select {
	case <-holed:
	case <-time.After(60 * time.Second):
		t.Fatal("the target event's handler did not run")
	}

	dedup := "INSERT INTO " + DefaultPrefix + ConsumeLogTable + " (consumer_group, event_id, event_type, request_hash, status, first_received_at, updated_at) VALUES (?, ?, 'Created', 'x', 'APPLIED', ?, ?)"
	now := time.Now().UTC()
	group := b.c.cfg.Group
	require.True(t, testenv.LockedOut(t, b.db, dedup, group, b.target, now, now), "the black-holed session does not hold the dedup row")
	b.hole.Restore() // new sessions pass; the server keeps the old one

	// The consumer gave up on its COMMIT and the redelivery's dedup
	// statement waits on the old session: still no effect, still locked.
	testenv.Eventually(t, 60*time.Second, "a failed attempt of the target", func() bool { return b.c.Processor().Stats().Retries >= 1 })
	testenv.Eventually(t, 60*time.Second, "the redelivery's dedup statement waiting on the old session", func() bool {
		n, err := testenv.LockWaiters(b.db, "INSERT INTO "+DefaultPrefix+ConsumeLogTable)
		require.NoError(t, err)
		return n >= 1
	})
	require.Zero(t, b.effects(t, b.target), "an effect while the server kept the session")
	require.True(t, testenv.LockedOut(t, b.db, dedup, group, b.target, now, now), "the server no longer keeps the session")

	ended := b.hole.EndSessions(t)
	require.Positive(t, ended, "no server session held in the black hole")
	t.Logf("server ended %d session(s) at %s", ended, time.Since(started).Round(time.Millisecond))
	testenv.Eventually(t, 60*time.Second, "the target applied", func() bool { return b.effects(t, b.target) == 1 })
	t.Logf("applied at %s, %d handler runs, stats %+v", time.Since(started).Round(time.Millisecond), b.runs.get(b.target), b.c.Processor().Stats())
	after := b.publishApplied(t)
	require.GreaterOrEqual(t, b.runs.get(b.target), 2, "the handler ran again after the rollback")
	b.settled(t, before, b.target, after)
}

// The COMMIT reaches the server and commits; its answer is lost into a
// black hole, so the consumer never learns it and does not acknowledge
// the message. The server ends the session; the partition heals for new
// sessions; the consumer's wait ends at its own timeout and the message is
// redelivered: a dedup hit, the handler not run again. One effect.
func TestBlackHoleDedupCommitAnswer(t *testing.T) {
	t.Parallel()
	eachDB(t, testBlackHoleDedupCommitAnswer)
}

func testBlackHoleDedupCommitAnswer(t *testing.T, db *sqlx.DB) {
	var lost atomic.Pointer[func() testenv.HoleCommit]
	b := newHoleBed(t, db, func(b *holeBed) {
		// Armed inside the transaction: the next COMMIT through the proxy
		// is this one (one queue, so no other message is in flight).
		f := b.hole.HoleCommitAnswer(t)
		lost.Store(&f)
	})
	before := b.publishApplied(t)
	started := time.Now()
	b.pb.send(b.topic, ev(b.target, "Created"), []byte(`{"n":1}`))
	var got testenv.HoleCommit
	testenv.Eventually(t, 60*time.Second, "the target's COMMIT answer lost", func() bool {
		if f := lost.Load(); f != nil {
			got = (*f)()
		}
		return got.Lost
	})
	require.True(t, got.Committed, "the server answered the COMMIT as committed (%s)", got.Answer)
	require.Equal(t, 1, b.effects(t, b.target), "the committed effect")

	ended := b.hole.EndSessions(t)
	require.Positive(t, ended, "no server session held in the black hole")
	b.hole.Restore()
	testenv.Eventually(t, 60*time.Second, "the redelivery found the dedup row", func() bool {
		return b.c.Processor().Stats().Duplicates >= 1
	})
	t.Logf("dedup hit at %s, stats %+v", time.Since(started).Round(time.Millisecond), b.c.Processor().Stats())
	after := b.publishApplied(t)
	require.Equal(t, 1, b.runs.get(b.target), "the handler ran once")
	b.settled(t, before, b.target, after)
}
