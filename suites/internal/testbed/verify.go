package testbed

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// truth is what the database says.
type truth struct {
	committed map[string]bool   // txlog COMMITTED, outbox row, or published
	rolled    map[string]bool   // txlog ROLLED_BACK
	orders    map[string]string // event id -> source
	outboxSt  map[string]string // event id -> outbox status
	effects   map[string]int    // event id -> effect rows
}

func (b *Bed) readTruth(ctx context.Context) (truth, error) {
	tr := truth{committed: map[string]bool{}, rolled: map[string]bool{}, orders: map[string]string{},
		outboxSt: map[string]string{}, effects: map[string]int{}}
	type kv struct {
		K string `db:"k"`
		V string `db:"v"`
	}
	read := func(q string, f func(kv)) error {
		var rows []kv
		if err := b.DB.SelectContext(ctx, &rows, q); err != nil {
			return err
		}
		for _, r := range rows {
			f(r)
		}
		return nil
	}
	if err := read("SELECT event_id AS k, state AS v FROM "+b.Store.Table(), func(r kv) {
		if r.V == string(txlog.StateCommitted) {
			tr.committed[r.K] = true
		} else {
			tr.rolled[r.K] = true
		}
	}); err != nil {
		return tr, err
	}
	if err := read("SELECT event_id AS k, status AS v FROM "+b.Obx.Name(), func(r kv) {
		tr.committed[r.K] = true
		tr.outboxSt[r.K] = r.V
	}); err != nil {
		return tr, err
	}
	if err := read("SELECT event_id AS k, source AS v FROM orders", func(r kv) { tr.orders[r.K] = r.V }); err != nil {
		return tr, err
	}
	b.mu.Lock()
	for id := range b.published {
		tr.committed[id] = true
	}
	b.mu.Unlock()
	var counts []struct {
		K string `db:"k"`
		N int    `db:"n"`
	}
	if err := b.DB.SelectContext(ctx, &counts, "SELECT event_id AS k, COUNT(*) AS n FROM effects GROUP BY event_id"); err != nil {
		return tr, err
	}
	for _, c := range counts {
		tr.effects[c.K] = c.N
	}
	return tr, nil
}

// pending are the ids a converged system still owes: committed but not
// applied or not seen by the collector, and outbox rows not yet SENT.
func (b *Bed) pending(tr truth, snap testenv.Snapshot) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id := range tr.committed {
		if tr.effects[id] == 0 || (snap.Counts[id] == 0 && !b.direct[id]) {
			out = append(out, id)
		} else if st, ok := tr.outboxSt[id]; ok && st != string(outbox.StatusSent) && st != string(outbox.StatusDead) {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// undecided returns the attempts whose outcome the broker may still be
// deciding: Sends that failed ambiguously and halves left by killed
// children, without a txlog row yet.
func (b *Bed) undecided(tr truth) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []string
	for id, a := range b.attempts {
		if a.Source == "outbox" || tr.committed[id] || tr.rolled[id] || b.published[id] {
			continue
		}
		ambiguous := (a.Source != "tx" && a.Source != "marker") || (a.Err != nil && !(a.Rollback && errors.Is(a.Err, txproducer.ErrLocalTx)))
		if ambiguous {
			out = append(out, id)
		}
	}
	return out
}

// Converge waits, bounded by timeout, until nothing is owed: every
// ambiguous attempt has a decision (or provably none: the settle bound
// FenceAge + 20 s passed) and every committed event is applied and
// collected. It returns when that happened (or the bound passed).
func (b *Bed) Converge(t *testing.T, timeout time.Duration) time.Time {
	t.Helper()
	ctx := context.Background()
	settleBy := time.Now().Add(FenceAge + 20*time.Second)
	deadline := time.Now().Add(timeout)
	for {
		tr, err := b.readTruth(ctx)
		if err == nil && len(b.pending(tr, b.Coll.Snapshot())) == 0 && (len(b.undecided(tr)) == 0 || time.Now().After(settleBy)) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			return time.Now()
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// markersTimeout bounds the wait for the markers.
const markersTimeout = 90 * time.Second

// Quiet proves that a converged bed stays quiet: it sends markers through
// the bed's topic and producer group (a producer instance of its own), as
// many as the topic has queues, so that the client's round robin puts one
// in every queue of every broker, and waits until each marker is committed,
// applied by the bed's consumers and received by the collector. Whatever a
// queue held before its marker has then been delivered; counting after
// this sees the late arrivals too (a half committed after convergence, a
// republish). It returns the markers' ids.
func (b *Bed) Quiet(t *testing.T) []string {
	t.Helper()
	want := map[string]bool{}
	for _, r := range b.Route {
		for q := 0; q < r.WriteQueues; q++ {
			want[fmt.Sprintf("%s/%d", r.Name, q)] = true
		}
	}
	require.NotEmpty(t, want, "the topic's route")
	p := b.StartProducer(t, "marker", nil)
	ctx := context.Background()
	var ids []string
	seen := map[string]bool{}
	for round := 0; round < 3 && len(seen) < len(want); round++ {
		var batch []string
		for i := 0; i < len(want); i++ {
			sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			id, err := b.sendAs(sctx, p, "marker", false)
			cancel()
			require.NoError(t, err, "marker %d", len(ids)+1)
			a, _ := b.Attempt(id)
			require.Equal(t, txproducer.StateCommitted, a.State, "marker %s", id)
			batch = append(batch, id)
		}
		ids = append(ids, batch...)
		ok := b.Coll.WaitUntil(markersTimeout, func(s testenv.Snapshot) bool {
			for _, id := range batch {
				if s.Counts[id] == 0 {
					return false
				}
			}
			return true
		})
		require.True(t, ok, "the markers reached the collector within %s", markersTimeout)
		for _, id := range batch {
			if m := b.Coll.Message(id); m != nil && m.Queue != nil {
				seen[fmt.Sprintf("%s/%d", m.Queue.BrokerName, m.Queue.QueueId)] = true
			}
		}
	}
	require.Len(t, seen, len(want), "a marker in every queue of the topic (%d markers)", len(ids))
	testenv.Eventually(t, markersTimeout, "the markers applied by the consumers", func() bool {
		q, args, err := sqlx.In("SELECT COUNT(DISTINCT event_id) FROM effects WHERE event_id IN (?)", ids)
		if err != nil {
			return false
		}
		var n int
		return b.DB.Get(&n, b.DB.Rebind(q), args...) == nil && n == len(ids)
	})
	return ids
}

// Verify waits for convergence (bounded by timeout), proves quiet with
// markers, then compares the database's truth with the consumers' view,
// records the figures in the scenario and asserts lost = ghosts = double
// effects = 0, no unexpected dead letter, and a positive number of
// committed events. The scenario counts as verified only if all of it
// passed.
func (b *Bed) Verify(t *testing.T, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	b.Converge(t, timeout)
	converged := time.Since(start)
	markers := b.Quiet(t)
	tr, err := b.readTruth(ctx)
	require.NoError(t, err)
	snap := b.Coll.Snapshot()
	stored := b.Coll.Stored()
	undecided := b.undecided(tr)

	sc := b.Sc
	b.mu.Lock()
	defer b.mu.Unlock()
	isMarker := map[string]bool{}
	for _, id := range markers {
		isMarker[id] = true
	}
	sc.Markers = len(markers)
	sc.Attempted = len(b.attempts) - len(markers)
	lost, ghosts := map[string]string{}, map[string]string{}
	for id := range tr.committed {
		if _, ok := b.attempts[id]; !ok {
			ghosts[id] = "committed row for an id this test never attempted"
		}
		if tr.effects[id] == 0 {
			lost[id] = "committed, no business effect"
		} else if snap.Counts[id] == 0 && !b.direct[id] {
			lost[id] = "committed, never delivered to the collector"
		}
	}
	for id := range tr.effects {
		if !tr.committed[id] {
			ghosts[id] = "business effect without a commit"
		}
	}
	for id, n := range snap.Counts {
		if !tr.committed[id] && n > 0 {
			ghosts[id] = "delivered without a commit"
		}
		sc.DupDeliver += n - 1
	}
	for id, as := range b.answers {
		for _, a := range as {
			if a.Decision == checkback.Commit && !tr.committed[id] {
				ghosts[id] = "check answered COMMIT without a committed row"
			}
		}
	}
	copies := map[int]int{} // stored copies -> committed events
	causes := map[string]int{}
	for id, a := range b.attempts {
		if a.Source == "tx" && a.Answered && a.Err == nil && a.State == txproducer.StateCommitted && !tr.committed[id] {
			lost[id] = "Send reported committed, txlog does not"
		}
		if a.Rollback && tr.committed[id] {
			ghosts[id] = "business function rolled back, yet committed"
		}
		if isMarker[id] {
			continue
		}
		if tr.committed[id] {
			sc.Committed++
			if n := stored[id]; n > 1 && !b.published[id] {
				sc.StoredTwice++
				copies[n]++
				causes[copyCause(a.Source, b.answers[id], b.recovered[id])]++
			}
		} else {
			sc.RolledBack++
		}
	}
	inconsistent := 0
	for id := range tr.committed {
		if _, ok := tr.orders[id]; !ok {
			inconsistent++
		}
	}
	for id := range tr.orders {
		if !tr.committed[id] {
			inconsistent++
		}
	}
	for id, n := range tr.effects {
		if !isMarker[id] {
			sc.Consumed++
		}
		if n > 1 {
			sc.Double++
		}
	}
	sc.Lost, sc.Ghosts = len(lost), len(ghosts)
	sc.DupAbsorb = 0
	for _, p := range b.procs {
		sc.DupAbsorb += int(p.Stats().Duplicates)
	}
	var parked int
	require.NoError(t, b.DB.GetContext(ctx, &parked, "SELECT COUNT(*) FROM rmqtx_dead_letter"))
	if len(b.sendErrs) > 0 {
		var parts []string
		for k, v := range b.sendErrs {
			parts = append(parts, fmt.Sprintf("%s=%d", k, v))
		}
		sort.Strings(parts)
		sc.Note("errors surfaced: %s", strings.Join(parts, " "))
	}
	if len(undecided) > 0 {
		forced := 0
		for _, id := range undecided {
			if a := b.attempts[id]; a != nil && errors.Is(a.Err, txproducer.ErrForcedRollback) {
				forced++
			}
		}
		if forced == 0 {
			sc.Note("%d failed sends never reached a broker (no half message, no txlog row)", len(undecided))
		} else {
			sc.Note("%d failed sends left no txlog row: %d never reached a broker, %d were halves the client rolled back on the broker's status (ErrForcedRollback)",
				len(undecided), len(undecided)-forced, forced)
		}
	}
	if sc.StoredTwice > 0 {
		var parts []string
		for n, k := range copies {
			parts = append(parts, fmt.Sprintf("%dx=%d", n, k))
		}
		sort.Strings(parts)
		var why []string
		for c, k := range causes {
			why = append(why, fmt.Sprintf("%s=%d", c, k))
		}
		sort.Strings(why)
		sc.Note("stored more than once: %d of %d committed events (copies: %s; by cause: %s)", sc.StoredTwice, sc.Committed, strings.Join(parts, " "), strings.Join(why, " "))
	}
	var version string
	if err := b.DB.GetContext(ctx, &version, "SELECT version()"); err == nil {
		if len(version) > 40 {
			version = version[:40]
		}
		sc.Note("database %s at %s: %s", b.DBRef, testenv.ServerAddr(t, b.DB), version)
	}
	sc.Note("converged in %s, then quiet: %d markers (one per queue) applied and collected; dead letters %d; orders/txlog/outbox mismatches %d",
		converged.Round(100*time.Millisecond), len(markers), parked, inconsistent)

	for id, why := range lost {
		t.Errorf("LOST %s: %s", id, why)
	}
	for id, why := range ghosts {
		t.Errorf("GHOST %s: %s; first delivery: %s", id, why, testenv.Describe(b.Coll.Message(id)))
	}
	if parked != b.parked {
		b.logDeadLetters(t)
	}
	require.Zero(t, sc.Lost, "lost")
	require.Zero(t, sc.Ghosts, "ghosts")
	require.Zero(t, sc.Double, "double effects")
	require.Zero(t, inconsistent, "the business rows match the txlog and outbox rows")
	require.Equal(t, b.parked, parked, "dead letters (only the expected payload conflicts)")
	require.Positive(t, sc.Committed, "committed events")
	t.Logf("%s: attempted=%d committed=%d rolled_back=%d consumed=%d lost=%d ghosts=%d dup_absorbed=%d dup_delivered=%d double=%d stored_more_than_once=%d recover=%s",
		sc.Name, sc.Attempted, sc.Committed, sc.RolledBack, sc.Consumed, sc.Lost, sc.Ghosts, sc.DupAbsorb, sc.DupDeliver, sc.Double, sc.StoredTwice, sc.Recover)
	sc.Verified = true
}

func (b *Bed) logDeadLetters(t *testing.T) {
	type dl struct {
		Topic   string `db:"topic"`
		Queue   int    `db:"queue_id"`
		Offset  int64  `db:"queue_offset"`
		MsgID   string `db:"msg_id"`
		EventID string `db:"event_id"`
		Class   string `db:"error_class"`
		Text    string `db:"error_text"`
	}
	var rows []dl
	if err := b.DB.Select(&rows, "SELECT topic, queue_id, queue_offset, msg_id, event_id, error_class, error_text FROM rmqtx_dead_letter ORDER BY id"); err == nil {
		for _, r := range rows {
			t.Logf("dead letter: topic=%s queue=%d offset=%d msgId=%s event=%q class=%s: %s", r.Topic, r.Queue, r.Offset, r.MsgID, r.EventID, r.Class, r.Text)
		}
	}
}

// copyCause names what most likely stored a committed event more than
// once: "check" when a producer answered a check of it with COMMIT (the
// broker checked a half whose "done" record it had not written yet, or a
// second half of the same event, and stored the event again on the
// answer; a half the client sent again after an attempt that timed out,
// though the broker had stored it, is committed that way too), "recovery"
// when discard recovery republished it, "outbox-resend" for an outbox row
// the dispatcher sent again (a send that failed or was not confirmed,
// e.g. FLUSH_SLAVE_TIMEOUT: stored on the master, its slave's copy not
// confirmed, so the row is sent until a send is), else "other".
func copyCause(source string, answers []Answer, recovered []discard.Result) string {
	for _, r := range recovered {
		if r.Decision == txlog.RecoveryRepublished {
			return "recovery"
		}
	}
	for _, a := range answers {
		if a.Decision == checkback.Commit {
			return "check"
		}
	}
	if source == "outbox" {
		return "outbox-resend"
	}
	return "other"
}
