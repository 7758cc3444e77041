package outbox

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// The held claim's SENT commit behind a black hole (testenv.DBHole: the
// sockets stay open, nothing flows, no reset), on the real broker and both
// databases. Dispatcher A's pool goes through the proxy; its sink is the
// real RocketMQSink, and the hole opens right after the sends succeeded,
// so the only thing at stake is the write that records them. An
// independent consumer (testenv.Collector) counts what reached the topic.

// holeLease is the dispatchers' LeaseDuration: the held claim's own
// deadline and the server's idle limit of its session.
const holeLease = 6 * time.Second

// afterSend is a BatchSink that runs hook once, as soon as want rows have
// been sent successfully, before the dispatcher sees the last result (the
// RocketMQSink's groups may be single rows, which the dispatcher sends
// with Send).
type afterSend struct {
	countingBatch
	want int
	once sync.Once
	hook func()
}

func (a *afterSend) Send(ctx context.Context, m *Message) error {
	err := a.countingBatch.Send(ctx, m)
	a.maybe()
	return err
}

func (a *afterSend) SendBatch(ctx context.Context, msgs []*Message) []error {
	errs := a.countingBatch.SendBatch(ctx, msgs)
	a.maybe()
	return errs
}

func (a *afterSend) maybe() {
	if sent, _ := a.snapshot(); len(sent) >= a.want {
		a.once.Do(a.hook)
	}
}

// holeDispatcher starts a held dispatcher (sink is a BatchSink) on pool
// (nil: b's own), whose rows all fit one claim, shut down when the test
// ends.
func (b *bed) holeDispatcher(t *testing.T, name string, sink BatchSink, pool *sqlx.DB) *Dispatcher {
	t.Helper()
	if pool == nil {
		pool = b.db
	}
	d, err := NewDispatcher(Config{DB: pool, Sink: sink, Name: name, BatchSize: 64, Concurrency: 4,
		PollInterval: 200 * time.Millisecond, LeaseDuration: holeLease})
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		require.NoError(t, d.Shutdown(ctx))
	})
	return d
}

// holeBed is the world of one test: the topic, its collector, the rows.
type holeBed struct {
	*bed
	hole  *testenv.DBHole
	topic string
	col   *testenv.Collector
	ids   []string
}

func newHoleBed(t *testing.T, b *bed, n int) *holeBed {
	h := &holeBed{bed: b, hole: testenv.NewDBHole(t, b.db), topic: testenv.Name(t, "topic")}
	testenv.CreateTopic(t, h.topic, 1)
	h.col = testenv.Collect(t, h.topic)
	h.ids = b.enqueue(t, events(h.topic, n)...)
	return h
}

// owners returns the owner token of every row, by event id.
func (h *holeBed) owners(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, id := range h.ids {
		r, err := h.table.Get(context.Background(), h.db, id)
		require.NoError(t, err)
		require.Equal(t, StatusSent, r.Status, "row %s", id)
		out[id] = r.OwnerToken
	}
	return out
}

// The hole opens after A's sends and before its outcome: the UPDATE to
// SENT and the COMMIT never reach the server, which keeps A's session and
// the rows' locks. Nothing else can send them meanwhile (B passes locked
// rows over). The server ends the session by itself, at the idle limit the
// claim set on it (wait_timeout; idle_in_transaction_session_timeout): the
// claim rolls back, the rows are PENDING as before, and they are sent again
// under the same event ids and recorded, by B or by A: the partition has
// healed for new sessions, so A's next claim competes with B's, and either
// may take the rows first (a fresh clone's run once saw A win). Nothing is
// lost, each row is sent once more and SENT by that claim, and the topic
// holds exactly two copies per row: A's first send, which its commit never
// recorded, and the second (at least once; consumers deduplicate by event
// id).
func TestBlackHoleBeforeHeldSentCommit(t *testing.T) {
	t.Parallel()
	eachDB(t, testBlackHoleBeforeHeldSentCommit)
}

func testBlackHoleBeforeHeldSentCommit(t *testing.T, b *bed) {
	const n = 5
	h := newHoleBed(t, b, n)
	holed := make(chan struct{})
	a := &afterSend{countingBatch: countingB(b.sink(t)), want: n, hook: func() { h.hole.BlackHole(); close(holed) }}
	da := b.holeDispatcher(t, "hole-a", a, h.hole.Pool(t, holeLease))
	t.Cleanup(h.hole.Cut) // before A's Shutdown, should the test stop early
	select {
	case <-holed:
	case <-time.After(60 * time.Second):
		t.Fatalf("dispatcher A did not send every row: %+v", da.Stats())
	}
	started := time.Now()
	sentA, _ := a.snapshot()
	require.Len(t, sentA, n, "A sent every row before the hole")

	// The server keeps A's session and its locks on the rows.
	lock := "SELECT event_id FROM " + b.table.Name() + " WHERE event_id = ? FOR UPDATE"
	require.True(t, testenv.LockedOut(t, b.db, lock, h.ids[0]), "the black-holed claim does not hold its rows")
	require.Positive(t, h.hole.HeldSessions(t))
	require.Equal(t, map[Status]int{StatusPending: n}, b.counts(t), "A's outcome reached the server")
	h.hole.Restore() // new sessions pass; the server keeps A's old one

	bs := countingB(b.sink(t))
	db := b.holeDispatcher(t, "hole-b", bs, nil)
	// Only the server can end the claim now (A's client cannot reach it):
	// the rows' locks go when it does.
	testenv.Eventually(t, 60*time.Second, "the server ending A's claim at its idle limit", func() bool {
		return !testenv.LockedOut(t, b.db, lock, h.ids[0])
	})
	t.Logf("server ended A's claim %s after the hole", time.Since(started).Round(time.Millisecond))
	b.waitStatus(t, StatusSent, n, 60*time.Second)
	t.Logf("all SENT %s after the hole; A %+v; B %+v", time.Since(started).Round(time.Millisecond), da.Stats(), db.Stats())

	// Held claims write no token before their outcome, so whichever
	// token a row holds is that of the claim that sent it again.
	sentB, _ := bs.snapshot()
	sentAll, _ := a.snapshot() // A's first sends included
	for id, owner := range h.owners(t) {
		require.True(t, strings.HasPrefix(owner, "hole-a") || strings.HasPrefix(owner, "hole-b"), "row %s recorded by %s", id, owner)
		require.Equal(t, 1, sentB[id]+sentAll[id]-1, "sends of %s after the hole: A %d, B %d", id, sentAll[id]-1, sentB[id])
		if strings.HasPrefix(owner, "hole-b") {
			require.Equal(t, 1, sentB[id], "row %s recorded by B, which sent it", id)
		} else {
			require.Equal(t, 2, sentAll[id], "row %s recorded by A, which sent it again", id)
		}
	}
	require.True(t, h.col.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool {
		for _, id := range h.ids {
			if s.Counts[id] < 2 {
				return false
			}
		}
		return true
	}), "both copies of every row consumed: %v", h.col.Snapshot().Counts)
	// A marker after them: a third copy of any row would be counted.
	marker := b.enqueue(t, events(h.topic, 1)...)[0]
	require.True(t, h.col.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[marker] > 0 }), "marker")
	stored := h.col.Stored()
	for _, id := range h.ids {
		require.Equal(t, 2, stored[id], "copies of %s on the topic", id)
	}
	b.waitStatus(t, StatusSent, n+1, 60*time.Second)
	require.Equal(t, map[Status]int{StatusSent: n + 1}, b.counts(t), "rows in all")
}

// The SENT commit reaches the server and commits; its answer is lost into
// a black hole, so A never learns that it recorded the sends. The server
// ends A's session; the partition heals for new sessions. Nothing is sent
// again, by A or by B: the rows are SENT, each one copy on the topic,
// counted after a marker that went through after the heal.
func TestBlackHoleHeldSentCommitAnswer(t *testing.T) {
	t.Parallel()
	eachDB(t, testBlackHoleHeldSentCommitAnswer)
}

func testBlackHoleHeldSentCommitAnswer(t *testing.T, b *bed) {
	const n = 5
	h := newHoleBed(t, b, n)
	var (
		mu   sync.Mutex
		lost func() testenv.HoleCommit
	)
	// Armed after the sends: the next COMMIT through the proxy is the
	// claim's (a claim that finds no row rolls back; nothing else commits).
	a := &afterSend{countingBatch: countingB(b.sink(t)), want: n, hook: func() {
		mu.Lock()
		defer mu.Unlock()
		lost = h.hole.HoleCommitAnswer(t)
	}}
	da := b.holeDispatcher(t, "hole-a", a, h.hole.Pool(t, holeLease))
	t.Cleanup(h.hole.Cut) // before A's Shutdown, should the test stop early
	var got testenv.HoleCommit
	testenv.Eventually(t, 60*time.Second, "the SENT commit's answer lost", func() bool {
		mu.Lock()
		defer mu.Unlock()
		if lost != nil {
			got = lost()
		}
		return got.Lost
	})
	started := time.Now()
	require.True(t, got.Committed, "the server answered the COMMIT as committed (%s)", got.Answer)
	require.Equal(t, map[Status]int{StatusSent: n}, b.counts(t), "the commit recorded the sends")

	ended := h.hole.EndSessions(t)
	require.Positive(t, ended, "no server session held in the black hole")
	h.hole.Restore()
	bs := countingB(b.sink(t))
	db := b.holeDispatcher(t, "hole-b", bs, nil)
	marker := b.enqueue(t, events(h.topic, 1)...)[0]
	b.waitStatus(t, StatusSent, n+1, 60*time.Second)
	require.True(t, h.col.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Counts[marker] > 0 }), "marker")
	t.Logf("marker consumed %s after the lost answer; A %+v; B %+v", time.Since(started).Round(time.Millisecond), da.Stats(), db.Stats())

	for id, owner := range h.owners(t) {
		require.True(t, strings.HasPrefix(owner, "hole-a"), "row %s recorded by %s, not by A", id, owner)
	}
	sentA, _ := a.snapshot()
	sentB, _ := bs.snapshot()
	stored := h.col.Stored()
	for _, id := range h.ids {
		require.Equal(t, 1, sentA[id]+sentB[id], "sends of %s", id)
		require.Equal(t, 1, stored[id], "copies of %s on the topic", id)
	}
}
