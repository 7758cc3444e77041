package hasuite

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// TestMasterKilledUnderLoad SIGKILLs the master of the replica set while
// two producer instances send transactionally, an outbox dispatcher sends
// and a consumer group (one instance in single mode, one in batch mode)
// applies, then restarts the old master.
//
//   - (a) The controller promotes the slave: the test measures the time from
//     the kill to the promotion, to the first Send that commits after it and
//     to that event applied by a consumer (pulled from the promoted master),
//     and records every Send that failed with its RetryAdvice.
//   - (c) Four Sends are held inside their local transaction with their half
//     stored on both replicas (allAckInSyncStateSet) at the kill; two commit
//     and two roll back after it, and their END_TRANSACTION is lost
//     (Test.LoseEnd). Before the kill the slave must already list the
//     group's producer instances (their broker watchers heartbeat slaves);
//     after it, each held half must be decided by a check the promoted
//     master sent and the txlog answered, not by discard recovery. The test
//     measures the time to the first check answered after the kill.
//   - (b) The old master is started again: it must rejoin as slave, in the
//     sync state set, with the promoted master staying master.
//
// Lost 0, ghosts 0, double effects 0, and each failed Send's RetryAdvice
// fits what happened: never DontRetry (a broker outage is worth a retry),
// and RetryWithSameID for a Send whose event did commit. Runs on MariaDB,
// then on PostgreSQL (testenv.EachDB): one kill and one restart per
// database, the second with the roles swapped. Not parallel: it kills a
// broker.
func TestMasterKilledUnderLoad(t *testing.T) {
	testenv.Integration(t)
	suite.KeepUp(t, "n0", "n1")
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		masterKilledUnderLoad(t, newBed(t, "master-killed", db))
	})
}

// failoverFigures are what one run measured, beside the invariants.
type failoverFigures struct {
	oldMaster, newMaster string
	promotion            time.Duration // kill -> the controller names the new master
	firstCommit          time.Duration // kill -> first Send that committed after the kill
	firstCheck           time.Duration // kill -> first check answered (by the promoted master)
	firstApplied         time.Duration // kill -> the first committed Send's event applied by a consumer (pulled from the promoted master)
	rejoin               time.Duration // restart of the old master -> in the sync state set as slave
	probeFailures        int           // Sends of the probe that failed before the first commit
}

func masterKilledUnderLoad(t *testing.T, b *Bed) {
	// Both replicas run (an earlier half that failed may have left one
	// killed) and are in sync.
	suite.MustService(t, "up", "n0", "n1")
	out, err := suite.HAState("-wait-in-sync", "2", "-timeout", "180s")
	require.NoError(t, err, "both replicas in sync before the kill:\n%s", out)
	f := failoverFigures{oldMaster: suite.HAMaster()}
	require.NotEmpty(t, f.oldMaster)
	f.newMaster = other(f.oldMaster)
	t.Logf("before the kill:\n%s", out)

	p1, p2 := b.StartProducer(t, "p1", nil), b.StartProducer(t, "p2", nil)
	// The held Sends (below): their END_TRANSACTION is lost whatever
	// happens (Test.LoseEnd), so only a check of the promoted master, or
	// discard recovery, can decide their halves.
	var heldMu sync.Mutex
	heldIDs := map[string]bool{}
	p3 := b.StartProducer(t, "p3", func(c *txproducer.Config) {
		c.Test.LoseEnd = func(id string) bool {
			heldMu.Lock()
			defer heldMu.Unlock()
			return heldIDs[id]
		}
	})
	probe := b.StartProducer(t, "probe", nil)
	b.StartConsumer(t, "c1")
	b.StartConsumerWith(t, "c2-batch", func(c *consumer.Config) { c.BatchTransaction, c.BatchSize = true, 8 })
	d := b.StartDispatcher(t, outbox.Config{Name: "obx-ha", PollInterval: 200 * time.Millisecond, LeaseDuration: 5 * time.Second})

	var okAtRejoin int64
	rejoined := make(chan struct{})
	l := b.StartLoad(testbed.LoadConfig{Producers: []*txproducer.Producer{p1, p2}, Dispatcher: d, OutboxEvery: 4, Workers: 3,
		Limiter: rate.NewLimiter(10, 1),
		Stop: func(l *testbed.Load) bool {
			select {
			case <-rejoined:
				return l.OK.Load()-okAtRejoin >= 30
			default:
				return false
			}
		}})
	t.Cleanup(l.StopAndWait)
	testenv.Eventually(t, 90*time.Second, "the load to commit 30 events before the kill", func() bool { return l.OK.Load() >= 30 })

	// (c) Four Sends held inside their local transaction, each with its
	// half on both replicas; the first two commit after the kill, the
	// other two roll back.
	release := make(chan struct{})
	var held []string
	var heldWG sync.WaitGroup
	entered := make(chan string, 4)
	for i := 0; i < 4; i++ {
		id, rollback := wire.NewEventID(), i >= 2
		heldMu.Lock()
		heldIDs[id] = true
		heldMu.Unlock()
		a := &testbed.Attempt{ID: id, Source: "tx", Rollback: rollback}
		b.Record(a)
		held = append(held, id)
		heldWG.Add(1)
		go func() {
			defer heldWG.Done()
			res, err := p3.Send(context.Background(), b.Message(id), func(ctx context.Context, tx *sqlx.Tx) error {
				if err := testbed.InsertOrder(id, "held", false)(ctx, tx); err != nil {
					return err
				}
				entered <- id
				<-release
				if rollback {
					return testbed.ErrBusiness
				}
				return nil
			})
			b.Answered(a, res.State, err)
		}()
	}
	for range held {
		<-entered
	}
	for _, id := range held {
		for _, n := range []string{f.oldMaster, f.newMaster} {
			require.True(t, halfOn(suite.Node(n), id), "the held half %s is stored on %s (%s)", id, n, suite.Node(n))
		}
	}

	// The slave already lists every producer instance of the group: each
	// instance's broker watcher heartbeats the slaves, so the slave, once
	// promoted, has a channel for its checks from its first check pass.
	testenv.Eventually(t, 60*time.Second, "the slave "+f.newMaster+" to list the group's four producer instances", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ids, err := remoting.ProducerConnections(ctx, suite.Node(f.newMaster), 3*time.Second, b.PGroup)
		return err == nil && len(ids) >= 4
	})

	okAtKill, errsAtKill := l.OK.Load(), l.Errs.Load()
	out = suite.MustService(t, "kill9", "master")
	killedAt := time.Now()
	require.Contains(t, out, "master is "+f.oldMaster)
	close(release) // the held local transactions end; END_TRANSACTION goes to the dead master

	// (a) Promotion, seen by the controller.
	for !strings.Contains(haState(), "master="+f.newMaster+" ") {
		require.Less(t, time.Since(killedAt), 60*time.Second, "the controller promoted %s within 60 s", f.newMaster)
		time.Sleep(100 * time.Millisecond)
	}
	f.promotion = time.Since(killedAt)

	// The first Send that commits after the kill: a probe that sends until
	// one does (each attempt bounded by 10 s, recorded like any Send).
	var firstID string
	for {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		id, err := b.SendTxID(sctx, probe, false)
		cancel()
		if err == nil {
			f.firstCommit = time.Since(killedAt)
			firstID = id
			break
		}
		f.probeFailures++
		t.Logf("probe Send %d after the kill failed (%s): %v", f.probeFailures, txproducer.RetryAdvice(err), err)
		require.Less(t, time.Since(killedAt), 2*time.Minute, "a Send commits within 2 minutes of the kill")
		time.Sleep(200 * time.Millisecond)
	}
	// The consumers pull it from the promoted master: their master watch
	// reads the new route at once instead of at the client's 30 s refresh.
	testenv.Eventually(t, 90*time.Second, "the first event committed after the kill applied by a consumer", func() bool {
		var n int
		err := b.DB.Get(&n, b.DB.Rebind("SELECT COUNT(*) FROM effects WHERE event_id = ?"), firstID)
		return err == nil && n > 0
	})
	f.firstApplied = time.Since(killedAt)
	heldWG.Wait()
	for i, id := range held {
		a, _ := b.Attempt(id)
		if i < 2 {
			assert.NoError(t, a.Err, "held Send %s: its local transaction committed after the kill", id)
			assert.Equal(t, txproducer.StateCommitted, a.State, "held Send %s", id)
		} else {
			assert.ErrorIs(t, a.Err, txproducer.ErrLocalTx, "held Send %s: its function refused", id)
		}
	}

	// The held halves: their END was lost (Test.LoseEnd), so each must be
	// decided by a check of the promoted master (only it runs until the
	// restart below, so every check answered now is its), not by discard
	// recovery after the broker gave it up.
	by := map[string]string{}
	testenv.Eventually(t, 100*time.Second, "the held halves decided by a check or recovery", func() bool {
		for _, id := range held {
			if by[id] == "" {
				by[id] = decidedAfter(b, id, killedAt)
			}
			if by[id] == "" {
				return false
			}
		}
		return true
	})
	for i, id := range held {
		want := "check commit"
		if i >= 2 {
			want = "check rollback"
		}
		assert.Equal(t, want, by[id], "held half %s: decided by the promoted master's check", id)
	}
	first, ok := b.FirstAnswerAfter(killedAt)
	if ok {
		f.firstCheck = first.Sub(killedAt)
	}
	testenv.Eventually(t, 90*time.Second, "30 more events committed on the promoted master", func() bool { return l.OK.Load()-okAtKill >= 30 })
	okOnPromoted, errsOnPromoted := l.OK.Load()-okAtKill, l.Errs.Load()-errsAtKill

	// (b) The old master comes back: it rejoins as slave.
	restartAt := time.Now()
	suite.MustService(t, "up", f.oldMaster)
	out, err = suite.HAState("-wait-in-sync", "2", "-timeout", "120s")
	require.NoError(t, err, "both replicas in sync after the restart:\n%s", out)
	f.rejoin = time.Since(restartAt)
	require.Contains(t, out, "master="+f.newMaster+" ", "the promoted master stays master")
	require.Regexp(t, `(?m)^`+f.oldMaster+` +\S+ +in-sync +SLAVE$`, out, "the old master rejoined as slave")
	t.Logf("after the restart:\n%s", out)
	okAtRejoin = l.OK.Load()
	close(rejoined)
	if !l.Finished(2 * time.Minute) {
		t.Fatalf("the load did not finish after the old master rejoined: %d committed since", l.OK.Load()-okAtRejoin)
	}
	b.Sc.Recover = b.Converge(t, 2*time.Minute).Sub(killedAt)

	b.Verify(t, 2*time.Minute)
	advice := checkAdvice(t, b)
	rec := b.RecoveryDecisions()
	b.Sc.Note("%s (master) killed: %s promoted after %s; first Send committed %s after the kill (%d probe Sends failed first), and applied by a consumer %s after it; first check answered by the promoted master %s after the kill",
		f.oldMaster, f.newMaster, f.promotion.Round(10*time.Millisecond), f.firstCommit.Round(10*time.Millisecond), f.probeFailures,
		f.firstApplied.Round(10*time.Millisecond), roundOrNone(f.firstCheck))
	b.Sc.Note("%d Sends/enqueues committed and %d failed between the kill and the restart; %s restarted and in the sync state set as slave after %s",
		okOnPromoted, errsOnPromoted, f.oldMaster, f.rejoin.Round(100*time.Millisecond))
	b.Sc.Note("held halves (2 committed, 2 rolled back after the kill): %s", describeHeld(held, by))
	b.Sc.Note("failed Sends by class and RetryAdvice: %s; discard recovery: %d events (%s)", advice, b.RecoveredIDs(), describeRecovery(rec))
	t.Logf("FIGURES %s: %+v", b.Kind, f)
}

// halfOn reports whether the broker at addr holds the half of id in its
// index (within 10 s): on the slave, proof that the half was replicated.
func halfOn(addr, id string) bool {
	look := inspect.RemotingLookup{Brokers: []string{addr}, Timeout: 2 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ms, _ := look.QueryByKey(context.Background(), inspect.HalfTopic, id, 4); len(ms) > 0 {
			return true
		}
	}
	return false
}

// haState is the controller's view now (HAState's output).
func haState() string {
	out, _ := suite.HAState("-timeout", "3s") // a non-zero exit only says a node is down
	return out
}

// decidedAfter says how the half of id was decided after t: "check commit"
// or "check rollback" (an answer to a check), "recovery <decision>", or ""
// (not yet).
func decidedAfter(b *Bed, id string, t time.Time) string {
	for _, a := range b.Answers(id) {
		if a.At.After(t) && (a.Decision == checkback.Commit || a.Decision == checkback.Rollback) {
			return "check " + strings.ToLower(a.Decision.String())
		}
	}
	for _, r := range b.Recovered(id) {
		if r.Decision != "" {
			return "recovery " + string(r.Decision)
		}
	}
	return ""
}

// checkAdvice asserts that every failed Send's RetryAdvice fits what
// happened, and tallies them per class and advice: a Send that failed for
// the broker's sake is worth a retry (never DontRetry), and one whose event
// committed anyway must be retried with the same id (the retry then finds
// it committed). A forced rollback (the client ended a stored half with
// ROLLBACK on a slave status) committed nothing and left no txlog row: the
// local transaction never ran, and the same id commits on a retry.
func checkAdvice(t *testing.T, b *Bed) string {
	t.Helper()
	var rows []struct {
		ID    string `db:"event_id"`
		State string `db:"state"`
	}
	require.NoError(t, b.DB.Select(&rows, "SELECT event_id, state FROM "+b.Store.Table()))
	committed, logged := map[string]bool{}, map[string]string{}
	for _, r := range rows {
		committed[r.ID] = r.State == string(txlog.StateCommitted)
		logged[r.ID] = r.State
	}
	tally := map[string]int{}
	for _, a := range b.Attempts() {
		id := a.ID
		if a.Err == nil || a.Source == "outbox" || (a.Rollback && errors.Is(a.Err, txproducer.ErrLocalTx)) {
			continue
		}
		class, _ := testbed.Classify(a.Err)
		adv := txproducer.RetryAdvice(a.Err)
		if errors.Is(a.Err, txproducer.ErrForcedRollback) {
			class = "ErrForcedRollback"
			assert.Empty(t, logged[id], "Send %s was rolled back by the client (%v): its local transaction never ran, no txlog row", id, a.Err)
			assert.Equal(t, txproducer.RetryWithSameID, adv, "Send %s was rolled back by the client (%v): nothing committed, retry with the same id", id, a.Err)
		}
		tally[fmt.Sprintf("%s/%s", class, adv)]++
		t.Logf("failed Send %s (committed in the txlog: %t): %s, %s: %v", id, committed[id], class, adv, a.Err)
		assert.NotEqual(t, txproducer.DontRetry, adv, "Send %s failed by the failover (%v): it is worth a retry", id, a.Err)
		if committed[id] {
			assert.Equal(t, txproducer.RetryWithSameID, adv, "Send %s failed (%v) but its event committed: retry with the same id", id, a.Err)
		}
	}
	if len(tally) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range tally {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func describeHeld(held []string, by map[string]string) string {
	var parts []string
	for i, id := range held {
		what := "commit"
		if i >= 2 {
			what = "rollback"
		}
		parts = append(parts, fmt.Sprintf("%s…%s→%s", what, id[len(id)-6:], by[id]))
	}
	return strings.Join(parts, ", ")
}

func describeRecovery(m map[txlog.RecoveryDecision]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func roundOrNone(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.Round(10 * time.Millisecond).String()
}
