//go:build failpoints

package faultsuite

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	childLease   = 3 * time.Second
)

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
	default:
		t.Fatalf("unknown role %q", role)
	}
	<-time.After(childWatchdog)
	t.Fatalf("%s: failpoint %s never fired", role, os.Getenv(failpoint.EnvVar))
}

// crashChild runs one subprocess and reports an error unless it died by the
// failpoint's SIGKILL.
func (b *bed) crashChild(role, fp, name, eventID string) error {
	_, err := testenv.Child{Test: "TestHelperProcess", Failpoint: fp, Timeout: childWatchdog + 30*time.Second, Env: []string{
		envRole + "=" + role, envDB + "=" + b.DBRef, envTopic + "=" + b.Topic, envPGroup + "=" + b.PGroup, envCGroup + "=" + b.CGroup,
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

	// Run the subprocesses, three at a time (over both databases).
	var (
		mu       sync.Mutex
		failures []string
		held     = map[string]int{} // outbox failpoint -> SENDING rows left by the killed dispatchers (none with held claims)
		wg       sync.WaitGroup
	)
	start := time.Now()
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
	b.Verify(t, 4*time.Minute)

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
