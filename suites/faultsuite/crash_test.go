//go:build failpoints

package faultsuite

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// Environment of a crash subprocess.
const (
	envRole    = "RMQTX_FAULTSUITE_ROLE"
	envDB      = "RMQTX_FAULTSUITE_DB"
	envTopic   = "RMQTX_FAULTSUITE_TOPIC"
	envPGroup  = "RMQTX_FAULTSUITE_PGROUP"
	envCGroup  = "RMQTX_FAULTSUITE_CGROUP"
	envEventID = "RMQTX_FAULTSUITE_EVENT_ID"
	envName    = "RMQTX_FAULTSUITE_NAME"

	roleProducer = "producer"
	roleOutbox   = "outbox"
	roleConsumer = "consumer"
	roleBatch    = "consumer-batch" // a batch-mode consumer of the batch group
	childLease   = 3 * time.Second
)

// Batch mode (consumer.Config.BatchTransaction) in the crash matrix: the
// windows of a batch transaction, each a child of the batch group killed
// there. The first two are not library failpoints: the child's handler
// sends itself SIGKILL (the Failpoint field of the child names the window;
// no library site matches it). The third is the library's own.
const (
	// batchMidTx: the second event of a batch transaction starts, the
	// first one's effect written, nothing committed.
	batchMidTx = "suite.batch-mid-tx"
	// batchBeforeCommit: the last handler of a full batch wrote its
	// effect; the COMMIT is not sent. The child's BatchSize is
	// beforeCommitBatch, so any batch of two new events is full (a batch
	// that mixes new events with ones an earlier child committed runs its
	// new ones alone).
	batchBeforeCommit = "suite.batch-before-commit"
	// batchAfterCommit: a batch of several events committed, its offset
	// not yet at the broker. The library's failpoint.AfterConsumeCommit
	// fires at the first commit, which may hold one event; here a watcher
	// in the child polls (every 5 ms) until the first transaction that held
	// two events is visible as committed, and kills the child then, long
	// before the client's next offset persist (every 5 s): the batch comes
	// back to the group.
	batchAfterCommit = "suite.batch-after-commit"

	batchSize         = 8               // the batch group's consumer.Config.BatchSize
	beforeCommitBatch = 2               // the BatchSize of the children killed before their COMMIT
	batchTable        = "batch_effects" // the batch group's effects (testbed.Bed.CreateEffects)
	batchBacklog      = 48              // committed events the batch group owes before its first child starts
)

// batchHandler writes the batch group's effect of ev; kill, when set, is
// called with the number of events the transaction held so far, before
// (mid) or after (before commit) the effect is written.
func batchHandler(name, mode string, pair chan<- [2]string) consumer.Handler {
	var mu sync.Mutex
	seen := map[*sqlx.Tx]int{}
	first := map[*sqlx.Tx]string{}
	return func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		mu.Lock()
		seen[tx]++
		n := seen[tx]
		if n == 1 {
			first[tx] = ev.ID
		}
		if n == 2 && pair != nil {
			select {
			case pair <- [2]string{first[tx], ev.ID}: // the first transaction of two events
			default:
			}
		}
		mu.Unlock()
		if mode == batchMidTx && n == 2 {
			die()
		}
		if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+batchTable+" (event_id, consumer) VALUES (?, ?)"), ev.ID, name); err != nil {
			return err
		}
		if mode == batchBeforeCommit && n == beforeCommitBatch {
			die()
		}
		return nil
	}
}

// die kills the process the way a failpoint does.
func die() {
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // never returns: the signal is on its way
}

// killAfterCommit is batchAfterCommit's watcher: once the handler hands
// over the first two events that shared a transaction, it polls until both
// effects are visible (committed), then kills the process.
func killAfterCommit(db *sqlx.DB, name string, pair <-chan [2]string) {
	ids := <-pair
	q := db.Rebind("SELECT COUNT(*) FROM " + batchTable + " WHERE consumer = ? AND event_id IN (?, ?)")
	for {
		var n int
		if db.Get(&n, q, name, ids[0], ids[1]) == nil && n == 2 {
			die()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// batchConfig is the config of an instance of the batch group; pair, when
// set, receives the first two events that shared a transaction.
func batchConfig(db *sqlx.DB, nameServer, topic, group, name, mode string, pair chan<- [2]string) consumer.Config {
	c := testbed.ConsumerConfig(db, nameServer, topic, group, name)
	c.Routes = map[string]consumer.Route{testbed.EventType: {Handler: batchHandler(name, mode, pair)}}
	c.BatchTransaction, c.BatchSize = true, batchSize
	if mode == batchBeforeCommit {
		c.BatchSize = beforeCommitBatch
	}
	return c
}

// TestHelperProcess is not a test: the crash matrix re-executes the test
// binary to run it as a producer, dispatcher or consumer of the scenario's
// groups, with one failpoint armed. The failpoint kills it with SIGKILL;
// reaching the end is a failure.
func TestHelperProcess(t *testing.T) {
	if !testenv.IsChild(t) {
		return
	}
	role := os.Getenv(envRole)
	s := testenv.Load()
	db := testenv.OpenDBRefEnv(t, envDB) // "mysql/<name>" or "postgres/<name>"
	topic, name := os.Getenv(envTopic), os.Getenv(envName)
	ctx := context.Background()
	switch role {
	case roleProducer:
		p, err := txproducer.New(txproducer.Config{NameServers: []string{s.NameServer}, Group: os.Getenv(envPGroup), DB: db,
			FenceAge: testbed.FenceAge, WarmupTopics: []string{topic}, DisableRecovery: true, InstanceName: name})
		require.NoError(t, err)
		require.NoError(t, p.Start(ctx))
		id := os.Getenv(envEventID)
		_, err = p.Send(ctx, testbed.Message("faultsuite", topic, id), testbed.InsertOrder(id, "tx", false))
		t.Fatalf("Send returned (%v): failpoint %s never fired", err, os.Getenv(failpoint.EnvVar))
	case roleOutbox:
		sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{s.NameServer},
			Group: os.Getenv(envPGroup) + "_obx", InstanceName: name})
		require.NoError(t, err)
		d, err := outbox.NewDispatcher(outbox.Config{DB: db, Sink: sink, Name: name, BatchSize: 4, Concurrency: 4,
			LeaseDuration: childLease, SendTimeout: 2 * time.Second, PollInterval: 50 * time.Millisecond})
		require.NoError(t, err)
		require.NoError(t, d.Start(ctx))
		d.Notify()
	case roleConsumer:
		c, err := consumer.New(testbed.ConsumerConfig(db, s.NameServer, topic, os.Getenv(envCGroup), name))
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
	case roleBatch:
		mode := os.Getenv(failpoint.EnvVar)
		var pair chan [2]string
		if mode == batchAfterCommit {
			pair = make(chan [2]string, 1)
			go killAfterCommit(db, name, pair)
		}
		c, err := consumer.New(batchConfig(db, s.NameServer, topic, os.Getenv(envCGroup), name, mode, pair))
		require.NoError(t, err)
		require.NoError(t, c.Start(ctx))
	default:
		t.Fatalf("unknown role %q", role)
	}
	<-time.After(childWatchdog)
	t.Fatalf("%s: failpoint %s never fired", role, os.Getenv(failpoint.EnvVar))
}

// crashChild runs one subprocess and reports an error unless it died by the
// failpoint's SIGKILL.
func (b *bed) crashChild(role, fp, name, eventID string) error {
	group := b.CGroup
	if role == roleBatch {
		group = b.batchGroup()
	}
	_, err := testenv.Child{Test: "TestHelperProcess", Failpoint: fp, Timeout: childWatchdog + 30*time.Second, Env: []string{
		envRole + "=" + role, envDB + "=" + b.DBRef, envTopic + "=" + b.Topic, envPGroup + "=" + b.PGroup, envCGroup + "=" + group,
		envEventID + "=" + eventID, envName + "=" + name,
	}}.Crash(context.Background())
	if err != nil {
		return fmt.Errorf("%s: %w", role, err)
	}
	return nil
}

type crashJob struct {
	role, fp, name, id string
}

// batchGroup is the consumer group of the batch-mode children: a group of
// its own, so that it starts with a backlog (a new group reads from the
// first offset) and its batches hold several events.
func (b *bed) batchGroup() string { return b.CGroup + "_batch" }

// TestCrashMatrix kills subprocesses with SIGKILL at every failpoint window,
// cfg.crashes times each, while a second instance of the same group lives in
// this process and a paced load of transactional Sends and outbox enqueues
// runs. Then it compares the database's truth with the consumers' view.
//
// Expected per window: a producer killed after the half message or inside
// the local transaction leaves a half that the survivor fences (ROLLED_BACK,
// never delivered); killed after the local commit or after END_TRANSACTION,
// the event is COMMITTED and delivered (check-back or end-transaction). A
// dispatcher killed after its claim or after its send leaves its rows
// unmarked: SENDING until the lease ends, or, with a held claim (the
// RocketMQ sink is a BatchSink), claimable again at once; a survivor sends
// them (after a send: delivered twice, applied once). A consumer killed after
// its commit and before its ACK gets the message redelivered to the
// survivor: a dedup hit.
//
// It runs on MariaDB and on PostgreSQL (subtests "mysql" and "postgres"),
// the crash children opening the subtest's database; childSlots bounds the
// children of both together.
func TestCrashMatrix(t *testing.T) {
	t.Parallel()
	eachDB(t, "crash-matrix", crashMatrix)
}

// childSlots bounds the crash children running at once, over every
// database's crash matrix: each is a -race test binary with its own
// RocketMQ client, on a 2-core machine.
var childSlots = make(chan struct{}, 3)

func crashMatrix(t *testing.T, b *bed) {
	b.CreateEffects(t, batchTable)
	p := b.StartProducer(t, "parent", nil)
	b.StartConsumer(t, "parent")
	// The parent's dispatcher polls slowly and is never notified, so the
	// crashing dispatchers (polling every 50 ms) claim most rows first.
	b.StartDispatcher(t, outbox.Config{Name: "obx-parent", PollInterval: 500 * time.Millisecond, LeaseDuration: 10 * time.Second})

	target := int64(cfg.tx / 2)
	perSec := 8.0
	if *soakFlag {
		perSec = 40
	}
	lim := rate.NewLimiter(rate.Limit(perSec), 1)
	var crashesDone atomic.Bool
	l := b.StartLoad(testbed.LoadConfig{Producers: []*txproducer.Producer{p}, OutboxEvery: 3, Workers: cfg.workers, Limiter: lim,
		Stop: func(l *testbed.Load) bool { return crashesDone.Load() && l.N.Load() >= target }})
	t.Cleanup(l.StopAndWait)

	producerWindows := []string{failpoint.AfterHalfMessage, failpoint.InsideLocalTx, failpoint.AfterLocalCommit, failpoint.AfterEndTransaction}
	var jobs []crashJob
	for i := 0; i < cfg.crashes; i++ {
		for _, fp := range producerWindows {
			id := wire.NewEventID()
			b.Record(&testbed.Attempt{ID: id, Source: "crash:" + fp})
			jobs = append(jobs, crashJob{roleProducer, fp, fmt.Sprintf("%s-crash-%d-%s", b.PGroup, i, fp[len("producer."):]), id})
		}
		jobs = append(jobs,
			crashJob{roleOutbox, failpoint.AfterClaim, fmt.Sprintf("oc-claim-%d", i), ""},
			crashJob{roleOutbox, failpoint.AfterSend, fmt.Sprintf("oc-send-%d", i), ""},
			crashJob{roleConsumer, failpoint.AfterConsumeCommit, fmt.Sprintf("cc-%d-%s", i, testenv.RandSuffix(4)), ""},
		)
	}

	// The batch group's children, one window after the other, once the
	// group owes a backlog (a new group reads from the first offset), so
	// that every delivered batch holds several events.
	// After-commit first: its first commit is then a batch of events new
	// to the group (a later child's first commit may be a batch of events
	// an earlier child committed without an ACK, all dedup hits).
	batchWindows := []string{batchAfterCommit, batchMidTx, batchBeforeCommit}
	batchCrashes := 1 // CI: one per window (each waits for a backlog, one at a time)
	if *soakFlag {
		batchCrashes = cfg.crashes
	}
	var batchJobs []crashJob
	for i := 0; i < batchCrashes; i++ {
		for _, fp := range batchWindows {
			batchJobs = append(batchJobs, crashJob{roleBatch, fp, fmt.Sprintf("bc-%d-%s", i, fp[strings.LastIndex(fp, ".")+1:]), ""})
		}
	}

	// Run the subprocesses, three at a time (over both databases).
	var (
		mu             sync.Mutex
		failures       []string
		held           = map[string]int{}   // outbox failpoint -> SENDING rows left by the killed dispatchers (none with held claims)
		batchCommitted = map[string][]int{} // batch window -> events each child killed there had committed
		wg             sync.WaitGroup
	)
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		if !testenv.Await(3*time.Minute, func() bool { return l.OK.Load() >= batchBacklog }) {
			mu.Lock()
			failures = append(failures, fmt.Sprintf("batch group: the load did not commit %d events within 3 minutes", batchBacklog))
			mu.Unlock()
			return
		}
		for _, j := range batchJobs {
			childSlots <- struct{}{}
			err := b.crashChild(j.role, j.fp, j.name, j.id)
			<-childSlots
			var n int
			if err == nil {
				err = b.DB.Get(&n, b.DB.Rebind("SELECT COUNT(*) FROM "+batchTable+" WHERE consumer = ?"), j.name)
			}
			mu.Lock()
			if err != nil {
				failures = append(failures, err.Error())
			} else {
				batchCommitted[j.fp] = append(batchCommitted[j.fp], n)
			}
			mu.Unlock()
		}
	}()
	for _, j := range jobs {
		wg.Add(1)
		childSlots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-childSlots }()
			if err := b.crashChild(j.role, j.fp, j.name, j.id); err != nil {
				mu.Lock()
				failures = append(failures, err.Error())
				mu.Unlock()
				return
			}
			if j.role == roleOutbox {
				var n int
				_ = b.DB.Get(&n, b.DB.Rebind("SELECT COUNT(*) FROM "+b.Obx.Name()+" WHERE status = 'SENDING' AND owner_token LIKE ?"), j.name+".%")
				mu.Lock()
				held[j.fp] += n
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	crashTook := time.Since(start)
	crashesDone.Store(true)
	lim.SetLimit(rate.Inf)
	require.Empty(t, failures, "every subprocess dies by SIGKILL at its failpoint")
	for _, n := range batchCommitted[batchAfterCommit] {
		require.GreaterOrEqual(t, n, 2, "a batch child killed after its commit had committed a batch of several events")
	}
	// The batch group's survivor, started once its children are dead,
	// drains the group: what the killed batches left uncommitted is
	// applied once, what one committed comes back as dedup hits. It starts
	// once the broker counts none of them: a heartbeat of a child that the
	// broker handles after the child's connection closed registers it
	// again until the broker's 120 s expiry scan (testenv.AwaitGroupEmptyOn),
	// and a survivor started before would leave the dead child its share of
	// the queues until its next rebalance after that scan.
	addrs := make([]string, len(b.Route))
	for i, rb := range b.Route {
		addrs[i] = rb.Addr
	}
	lingered := testenv.AwaitGroupEmptyOn(t, addrs, b.batchGroup(), 3*time.Minute)
	var survivorTxs testbed.BatchTxs
	scfg := batchConfig(b.DB, b.S.NameServer, b.Topic, b.batchGroup(), "batch-survivor", "", nil)
	scfg.Routes[testbed.EventType] = consumer.Route{Handler: survivorTxs.Wrap(scfg.Routes[testbed.EventType].Handler)}
	survivor, err := consumer.New(scfg)
	require.NoError(t, err)
	require.NoError(t, survivor.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = survivor.Shutdown(ctx)
	})

	// Producer windows: each crashed transaction ends decided as expected.
	outcome := map[string][2]int{} // failpoint -> [committed, rolled back]
	for _, j := range jobs {
		if j.role != roleProducer {
			continue
		}
		var row txlog.Row
		testenv.Eventually(t, 2*time.Minute, "a decision for the transaction crashed at "+j.fp, func() bool {
			r, err := b.Store.Get(context.Background(), j.id)
			row = r
			return err == nil
		})
		o := outcome[j.fp]
		switch j.fp {
		case failpoint.AfterHalfMessage, failpoint.InsideLocalTx:
			require.Equal(t, txlog.StateRolledBack, row.State, "%s: never committed", j.fp)
			require.Equal(t, txlog.ByFence, row.ResolvedBy, "%s: fenced by the surviving instance's check", j.fp)
			o[1]++
		default:
			require.Equal(t, txlog.StateCommitted, row.State, "%s: the local commit stands", j.fp)
			o[0]++
		}
		outcome[j.fp] = o
	}
	// The load finishes by itself once it reached its target.
	if !l.Finished(5 * time.Minute) {
		t.Fatalf("load did not finish: %d of %d attempts", l.N.Load(), target)
	}

	var parts []string
	for _, fp := range producerWindows {
		o := outcome[fp]
		parts = append(parts, fmt.Sprintf("%s x%d -> committed %d, fenced %d", fp, o[0]+o[1], o[0], o[1]))
	}
	b.Sc.Note("%d subprocesses SIGKILLed in %s: %s", len(jobs), crashTook.Round(time.Second), strings.Join(parts, "; "))
	b.Sc.Note("%s x%d (left %d SENDING rows), %s x%d (left %d), %s x%d",
		failpoint.AfterClaim, cfg.crashes, held[failpoint.AfterClaim], failpoint.AfterSend, cfg.crashes, held[failpoint.AfterSend],
		failpoint.AfterConsumeCommit, cfg.crashes)
	b.Sc.Note("batch group (BatchTransaction, BatchSize %d), children killed: %s x%d (committed before the kill: %v), %s x%d (%v), %s x%d (%v); the survivor waited %s for the broker to count none of them",
		batchSize, batchMidTx, batchCrashes, batchCommitted[batchMidTx], batchBeforeCommit, batchCrashes, batchCommitted[batchBeforeCommit],
		batchAfterCommit, batchCrashes, batchCommitted[batchAfterCommit], lingered.Round(10*time.Millisecond))
	b.Verify(t, 4*time.Minute)
	b.verifyBatchGroup(t, survivor, &survivorTxs)

	// A dispatcher killed after its send (a SIGKILL there is the proof the
	// window was reached) left the row unmarked, whether it claimed it
	// SENDING with a lease or in a held claim (a BatchSink): the event was
	// sent again, so the collector has it stored twice, and Verify found it
	// applied once.
	stored, resent := b.Coll.Stored(), 0
	for _, id := range b.AttemptIDs("outbox") {
		if stored[id] > 1 {
			resent++
		}
	}
	require.Positive(t, resent, "an outbox event sent by a dispatcher killed after its send is sent again")
	b.Sc.Note("outbox events sent again after a dispatcher died after its send: %d", resent)
}

// verifyBatchGroup counts the batch group once the bed is verified (every
// committed event delivered, markers included): every committed event has
// exactly one effect in batchTable (so the batch a child committed without
// its ACK was absorbed when it came back, to the survivor or to a later
// child), and none without a commit has one. The figures join the
// scenario's.
func (b *bed) verifyBatchGroup(t *testing.T, survivor *consumer.Consumer, txs *testbed.BatchTxs) {
	t.Helper()
	ctx := context.Background()
	var committed map[string]bool
	var effects map[string]int
	read := func() error {
		committed, effects = map[string]bool{}, map[string]int{}
		var ids []string
		if err := b.DB.SelectContext(ctx, &ids, b.DB.Rebind("SELECT event_id FROM "+b.Store.Table()+" WHERE state = ?"), string(txlog.StateCommitted)); err != nil {
			return err
		}
		var sent []string
		if err := b.DB.SelectContext(ctx, &sent, b.DB.Rebind("SELECT event_id FROM "+b.Obx.Name()+" WHERE status = ?"), string(outbox.StatusSent)); err != nil {
			return err
		}
		for _, id := range append(ids, sent...) {
			committed[id] = true
		}
		var rows []struct {
			K string `db:"k"`
			N int    `db:"n"`
		}
		if err := b.DB.SelectContext(ctx, &rows, "SELECT event_id AS k, COUNT(*) AS n FROM "+batchTable+" GROUP BY event_id"); err != nil {
			return err
		}
		for _, r := range rows {
			effects[r.K] = r.N
		}
		return nil
	}
	lost := func() int {
		n := 0
		for id := range committed {
			if effects[id] == 0 {
				n++
			}
		}
		return n
	}
	if !testenv.Await(2*time.Minute, func() bool { return read() == nil && lost() == 0 }) {
		require.NoError(t, read())
		b.logBatchGroup(t, survivor, committed, effects)
	}
	var ghosts, doubles int
	for id, n := range effects {
		if !committed[id] {
			ghosts++
		}
		if n > 1 {
			doubles++
		}
	}
	b.Sc.Lost += lost()
	b.Sc.Ghosts += ghosts
	b.Sc.Double += doubles
	multi, most := txs.Multi()
	st := survivor.Processor().Stats()
	b.Sc.Note("batch group: %d committed events, lost %d, ghosts %d, double effects %d; the survivor applied %d (in %d transactions of several events, up to %d), dedup hits %d",
		len(committed), lost(), ghosts, doubles, st.Applied, multi, most, st.Duplicates)
	require.Zero(t, lost(), "batch group: every committed event applied")
	require.Zero(t, ghosts, "batch group: nothing applied without a commit")
	require.Zero(t, doubles, "batch group: no double effect")
}

// logBatchGroup logs, when the survivor has not applied every committed
// event in time, what it takes to tell why: the survivor's counters, the
// group's consumers and committed offsets per queue against the queue's
// end, and where the broker stored the first unapplied events (as the
// bed's independent collector received them).
func (b *bed) logBatchGroup(t *testing.T, survivor *consumer.Consumer, committed map[string]bool, effects map[string]int) {
	t.Helper()
	group := b.batchGroup()
	t.Logf("batch group %s: survivor stats %+v", group, survivor.Processor().Stats())
	for _, rb := range b.Route {
		t.Logf("batch group on %s: %s", rb.Name, testenv.DescribeGroupOn(t, rb.Addr, b.Topic, group, rb.ReadQueues))
	}
	shown := 0
	for id := range committed {
		if effects[id] > 0 {
			continue
		}
		if shown++; shown > 20 {
			break
		}
		if m := b.Coll.Message(id); m != nil && m.Queue != nil {
			t.Logf("  unapplied %s: stored at %s/%d offset %d", id, m.Queue.BrokerName, m.Queue.QueueId, m.QueueOffset)
		} else {
			t.Logf("  unapplied %s: not seen by the collector", id)
		}
	}
}
