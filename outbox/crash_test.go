//go:build failpoints

package outbox

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
)

const (
	envHelperDB = "RMQTX_OUTBOX_HELPER_DB"
	childLease  = 3 * time.Second
)

// TestHelperProcessOutbox is the crashing dispatcher: it runs only when
// re-executed by a crash test, and is killed by the armed failpoint.
func TestHelperProcessOutbox(t *testing.T) {
	if !testenv.IsChild(t) {
		return // not a child: nothing to do
	}
	s := testenv.Load()
	db, err := sqlx.Open("mysql", s.DSN(os.Getenv(envHelperDB)))
	require.NoError(t, err)
	sink, err := NewRocketMQSink(RocketMQConfig{NameServers: []string{s.NameServer}, Group: "rmqtx_outbox_crash_child",
		InstanceName: "rmqtx-outbox-crash-child-" + randomSuffix()})
	require.NoError(t, err)
	d, err := NewDispatcher(Config{DB: db, Sink: sink, Name: "child", BatchSize: 4, Concurrency: 4,
		LeaseDuration: childLease, SendTimeout: 2 * time.Second, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	d.Notify()
	// The failpoint kills this process; reaching the timer is a failure.
	<-time.After(90 * time.Second)
	t.Fatalf("failpoint %s never fired; stats %+v", os.Getenv(failpoint.EnvVar), d.Stats())
}

// crashAt runs the helper dispatcher with failpoint fp armed against b's
// database, requires that it died by SIGKILL, and returns how many rows it
// left SENDING.
func crashAt(t *testing.T, b *bed, fp string) int {
	t.Helper()
	testenv.Child{Test: "TestHelperProcessOutbox", Failpoint: fp, Env: []string{envHelperDB + "=" + testenv.DBName(t, b.db)}}.MustCrash(t)
	var left int
	require.NoError(t, b.db.Get(&left, "SELECT COUNT(*) FROM "+b.table.Name()+" WHERE status = 'SENDING' AND owner_token LIKE 'child.%'"))
	return left
}

func runCrash(t *testing.T, fp string) {
	b := newBed(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	col := testenv.Collect(t, topic)
	const n = 20
	ids := b.enqueue(t, events(topic, n)...)

	left := crashAt(t, b, fp)
	require.Positive(t, left, "the child held claimed rows when it died")
	counts := b.counts(t)
	t.Logf("%s: child killed by SIGKILL holding %d SENDING rows (table %v)", fp, left, counts)

	m, err := metrics.New(prometheus.NewRegistry())
	require.NoError(t, err)
	sink := counting(b.sink(t))
	start := time.Now()
	d := b.dispatcher(t, Config{Sink: sink, Name: "survivor", PollInterval: 100 * time.Millisecond, Metrics: m})
	b.waitStatus(t, StatusSent, n, time.Minute)
	took := time.Since(start)
	snap := col.WaitDistinct(t, n, time.Minute)
	for _, id := range ids {
		require.Contains(t, snap.Counts, id, "nothing is lost")
	}
	st := d.Stats()
	require.EqualValues(t, left, st.TookOver, "the survivor took over exactly the rows the child held")
	require.Equal(t, float64(left), testutil.ToFloat64(m.OutboxLeaseExpired.WithLabelValues(topic)))
	var dupIDs []string
	for id, c := range snap.Counts {
		if c > 1 {
			dupIDs = append(dupIDs, id)
		}
	}
	if fp == failpoint.AfterSend {
		// The child's message reached the broker before it died: the
		// survivor sends it again, under the same event id.
		require.True(t, col.WaitUntil(time.Minute, func(s testenv.Snapshot) bool { return s.Total > s.Distinct() }),
			"the message sent before the crash is delivered twice")
		snap = col.Snapshot()
		dupIDs = dupIDs[:0]
		for id, c := range snap.Counts {
			if c > 1 {
				dupIDs = append(dupIDs, id)
			}
		}
	} else {
		require.Equal(t, snap.Distinct(), snap.Total, "nothing was sent before the crash, so nothing twice")
	}
	t.Logf("%s: survivor took over %d rows after the %s lease (%.1fs), all %d SENT; consumer deliveries %d, distinct %d, duplicated ids %d (%s)",
		fp, st.TookOver, childLease, took.Seconds(), n, snap.Total, snap.Distinct(), len(dupIDs), strings.Join(dupIDs, ","))
}

// TestCrashAfterClaim: a dispatcher dies after claiming, before sending.
// Another takes the rows over when the lease expires; nothing is lost.
func TestCrashAfterClaim(t *testing.T) {
	t.Parallel()
	runCrash(t, failpoint.AfterClaim)
}

// TestCrashAfterSend: a dispatcher dies after the broker stored a message
// and before marking it SENT. The row is sent again by the survivor (same
// event id), which the consumer's dedup absorbs; nothing is lost.
func TestCrashAfterSend(t *testing.T) {
	t.Parallel()
	runCrash(t, failpoint.AfterSend)
}
