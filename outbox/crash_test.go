//go:build failpoints

package outbox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
)

const (
	envHelperDB   = "RMQTX_OUTBOX_HELPER_DB"
	envHelperMode = "RMQTX_OUTBOX_HELPER_MODE"
	childLease    = 3 * time.Second

	// Helper modes: how the child dispatcher sends.
	modeHeld  = "held"  // the RocketMQSink as it is (a BatchSink): held claims, one write per row
	modeTwo   = "two"   // the same sink seen as a plain Sink: SENDING with a lease, then SENT
	modePause = "pause" // held claims whose sends never return; the parent stops the process
)

// holdingLine is what the pause-mode child prints when its sink is entered:
// the rows of that send are locked by the child's open claim.
const holdingLine = "HOLDING "

// sendOnly hides the BatchSink methods of a sink.
type sendOnly struct{ s Sink }

func (o sendOnly) Send(ctx context.Context, m *Message) error { return o.s.Send(ctx, m) }

// stuckSink is the pause-mode sink: a BatchSink whose sends announce their
// rows and then never return.
type stuckSink struct {
	*RocketMQSink
	mu sync.Mutex
}

func (s *stuckSink) announce(msgs []*Message) {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.EventID
	}
	s.mu.Lock()
	fmt.Fprintln(os.Stdout, holdingLine+strings.Join(ids, ","))
	s.mu.Unlock()
	select {} // the parent stops, then kills, this process
}

func (s *stuckSink) Send(_ context.Context, m *Message) error { s.announce([]*Message{m}); return nil }
func (s *stuckSink) SendBatch(_ context.Context, msgs []*Message) []error {
	s.announce(msgs)
	return nil
}

// TestHelperProcessOutbox is the crashing (or pausing) dispatcher: it runs
// only when re-executed by a crash test, and is killed by the armed
// failpoint, or stopped and killed by its parent.
func TestHelperProcessOutbox(t *testing.T) {
	if !testenv.IsChild(t) {
		return // not a child: nothing to do
	}
	s := testenv.Load()
	db := testenv.OpenDBRefEnv(t, envHelperDB) // either database: the parent's testenv.DBRef
	sink, err := NewRocketMQSink(RocketMQConfig{NameServers: []string{s.NameServer}, Group: "rmqtx_outbox_crash_child",
		InstanceName: "rmqtx-outbox-crash-child-" + randomSuffix()})
	require.NoError(t, err)
	var use Sink = sink
	switch os.Getenv(envHelperMode) {
	case modeTwo:
		use = sendOnly{sink}
	case modePause:
		use = &stuckSink{RocketMQSink: sink}
	}
	d, err := NewDispatcher(Config{DB: db, Sink: use, Name: "child", BatchSize: 4, Concurrency: 4,
		LeaseDuration: childLease, SendTimeout: 2 * time.Second, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	d.Notify()
	// The failpoint (or the parent) kills this process; reaching the timer
	// is a failure.
	<-time.After(90 * time.Second)
	t.Fatalf("child (%s, failpoint %q) was never killed; stats %+v", os.Getenv(envHelperMode), os.Getenv(failpoint.EnvVar), d.Stats())
}

// crashAt runs the helper dispatcher in mode with failpoint fp armed
// against b's database, requires that it died by SIGKILL, and returns how
// many rows it left SENDING.
func crashAt(t *testing.T, b *bed, mode, fp string) int {
	t.Helper()
	testenv.Child{Test: "TestHelperProcessOutbox", Failpoint: fp,
		Env: []string{envHelperDB + "=" + testenv.DBRef(t, b.db), envHelperMode + "=" + mode}}.MustCrash(t)
	var left int
	require.NoError(t, b.db.Get(&left, "SELECT COUNT(*) FROM "+b.table.Name()+" WHERE status = 'SENDING' AND owner_token LIKE 'child.%'"))
	return left
}

// runCrash kills a dispatcher at failpoint fp and lets a survivor finish.
// Held claims (mode held) leave nothing behind: the rows are PENDING as
// they were, claimable at once, and none is taken over. With two writes the
// rows the child held are SENDING until their lease expires, then taken over.
// Either way nothing is lost, and a message the child sent is delivered
// again, under its event id.
func runCrash(t *testing.T, b *bed, mode, fp string) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	const n = 20
	ids := b.enqueue(t, events(topic, n)...)

	left := crashAt(t, b, mode, fp)
	counts := b.counts(t)
	if mode == modeHeld {
		// The failpoints fire only with claimed rows: the child died holding
		// some, and wrote nothing, not even after a send.
		require.Zero(t, left, "a held claim writes no SENDING state")
		require.Equal(t, map[Status]int{StatusPending: n}, counts, "the rolled-back claim left every row as it was")
	} else {
		require.Positive(t, left, "the child held claimed rows when it died")
	}
	t.Logf("%s/%s: child killed by SIGKILL holding %d SENDING rows (table %v)", mode, fp, left, counts)

	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	sink := counting(b.sink(t))
	start := time.Now()
	d := b.dispatcher(t, Config{Sink: sink, Name: "survivor", PollInterval: 100 * time.Millisecond, Observe: observe.Observe{Metrics: m}})
	b.waitStatus(t, StatusSent, n, time.Minute)
	took := time.Since(start)
	snap := col.WaitDistinct(t, n, time.Minute)
	for _, id := range ids {
		require.Contains(t, snap.Counts, id, "nothing is lost")
	}
	st := d.Stats()
	require.EqualValues(t, left, st.TookOver, "the survivor took over exactly the rows the child left SENDING")
	require.Equal(t, float64(left), testutil.ToFloat64(m.OutboxLeaseExpired.WithLabelValues(topic)))
	var dupIDs []string
	if fp == failpoint.AfterSend {
		// The child's message reached the broker before it died: the
		// survivor sends it again, under the same event id.
		require.True(t, col.WaitUntil(time.Minute, func(s testenv.Snapshot) bool { return s.Total > s.Distinct() }),
			"the message sent before the crash is delivered twice")
		snap = col.Snapshot()
		for id, c := range snap.Counts {
			if c > 1 {
				dupIDs = append(dupIDs, id)
			}
		}
	} else {
		require.Equal(t, snap.Distinct(), snap.Total, "nothing was sent before the crash, so nothing twice")
	}
	t.Logf("%s/%s: survivor took over %d rows (lease %s), all %d SENT in %.1fs; consumer deliveries %d, distinct %d, duplicated ids %d (%s)",
		mode, fp, st.TookOver, childLease, n, took.Seconds(), snap.Total, snap.Distinct(), len(dupIDs), strings.Join(dupIDs, ","))
}

// TestCrashAfterClaim: a dispatcher dies after claiming, before sending.
// Held: its transaction dies with it and the rows are claimable at once.
// Two writes: another dispatcher takes the rows over when the lease
// expires. Nothing is lost.
func TestCrashAfterClaim(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{modeHeld, modeTwo} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			eachDB(t, func(t *testing.T, b *bed) { runCrash(t, b, mode, failpoint.AfterClaim) })
		})
	}
}

// TestCrashAfterSend: a dispatcher dies after the broker stored a message
// and before recording it SENT (held: before the claim's commit). The row
// is sent again by the survivor (same event id), which the consumer's
// dedup absorbs; nothing is lost.
func TestCrashAfterSend(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{modeHeld, modeTwo} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			eachDB(t, func(t *testing.T, b *bed) { runCrash(t, b, mode, failpoint.AfterSend) })
		})
	}
}

// TestPausedDispatcherIsOvertaken: a dispatcher stops running (SIGSTOP:
// paused, as a VM freeze or a partition leaves it) while its held claims
// keep rows locked. The client can end nothing; the server's idle limit
// (LeaseDuration) ends the zombie's sessions and rolls its claims back, and
// a survivor sends every row, the held ones too, each exactly once. The
// zombie is then killed (its late writes could only fail on the ended
// sessions; TestHeldClaimZombie checks that).
func TestPausedDispatcherIsOvertaken(t *testing.T) {
	t.Parallel()
	eachDB(t, testPausedDispatcherIsOvertaken)
}

func testPausedDispatcherIsOvertaken(t *testing.T, b *bed) {
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	const n = 20
	ids := b.enqueue(t, events(topic, n)...)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := testenv.Child{Test: "TestHelperProcessOutbox", Env: []string{
		envHelperDB + "=" + testenv.DBRef(t, b.db), envHelperMode + "=" + modePause}}.Command(ctx)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = cmd.Stdout
	require.NoError(t, cmd.Start())
	stopped := false
	defer func() {
		_ = cmd.Process.Kill()
		if stopped {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = cmd.Wait()
	}()
	held := map[string]bool{}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for len(held) == 0 {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the child ended before it held rows")
			if rest, ok := strings.CutPrefix(l, holdingLine); ok {
				for _, id := range strings.Split(rest, ",") {
					held[id] = true
				}
			}
		case <-ctx.Done():
			t.Fatal("the child never held rows")
		}
	}
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	stopped = true
	go func() {
		for range lines { // keep the pipe drained
		}
	}()

	var mu sync.Mutex
	outcomes := map[string][]Outcome{}
	sink := counting(b.sink(t))
	d := b.dispatcher(t, Config{Sink: sink, Name: "survivor", PollInterval: 100 * time.Millisecond,
		OnOutcome: func(o Outcome) {
			mu.Lock()
			outcomes[o.EventID] = append(outcomes[o.EventID], o)
			mu.Unlock()
		}})
	b.waitStatus(t, StatusSent, n, time.Minute)
	snap := col.WaitDistinct(t, n, time.Minute)
	for _, id := range ids {
		require.Equal(t, 1, snap.Counts[id], "row %s: delivered once (the zombie never sent it)", id)
	}
	require.Equal(t, n, snap.Total)
	mu.Lock()
	for id := range held {
		require.Len(t, outcomes[id], 1, "held row %s", id)
		require.Equal(t, StatusSent, outcomes[id][0].Status, "held row %s", id)
		require.False(t, outcomes[id][0].TookOver, "held row %s: no lease was involved", id)
	}
	mu.Unlock()
	require.Zero(t, d.Stats().TookOver)
	t.Logf("paused dispatcher: it held %d of %d rows when stopped; the server ended its sessions after the %s idle limit, and the survivor sent all %d, each once",
		len(held), n, childLease, n)
}
