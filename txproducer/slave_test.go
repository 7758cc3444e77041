package txproducer_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/rmqtxtest"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// A synchronous master whose slave is down (or a SYNC_FLUSH broker whose
// disk is slow) stores the half and answers SLAVE_NOT_AVAILABLE,
// FLUSH_SLAVE_TIMEOUT or FLUSH_DISK_TIMEOUT; the RocketMQ client then ends
// the half with ROLLBACK itself and never calls the local-transaction
// listener. These tests pin down what rmqtx makes of it: the outcome says
// so (ErrForcedRollback naming the status, StateRolledBack, RetryWithSameID,
// a Warn line without the payload, result "forced_rollback" in the sends
// metric), and nothing is committed anywhere, so no event can be rolled
// back under a transaction that commits it: no business row, no txlog row,
// the half rolled back on the broker. The kit's StatusNext plays the broker
// (a real SYNC_MASTER answers the same codes with the message stored).

// forcedStatuses are the broker's statuses of a stored half that make the
// client roll it back, with the client's names for them.
var forcedStatuses = []rmqtxtest.StoreStatus{rmqtxtest.SlaveNotAvailable, rmqtxtest.FlushSlaveTimeout, rmqtxtest.FlushDiskTimeout}

// orderRows counts the business rows of id.
func (k *kitBed) orderRows(t *testing.T, id string) int {
	t.Helper()
	var n int
	require.NoError(t, k.db.Get(&n, k.db.Rebind("SELECT COUNT(*) FROM orders WHERE id = ?"), id))
	return n
}

// requireNoTxlogRow asserts that id has no txlog row (read on k's database).
func (k *kitBed) requireNoTxlogRow(t *testing.T, id, what string) {
	t.Helper()
	_, err := k.store.Get(context.Background(), id)
	require.ErrorIs(t, err, txlog.ErrNotFound, what)
}

// Each status: the Send fails with ErrForcedRollback naming it, Result
// State RolledBack, RetryWithSameID; the function did not run, no business
// row and no txlog row exist, the half is rolled back on the broker and
// nothing reached the topic; a Warn line names the event, the half and the
// status and carries no payload; the sends metric counts forced_rollback.
// A retry with the same id once the broker answers SEND_OK commits the
// event, one copy, its function run once.
func TestKitForcedRollback(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		m, err := metrics.New(prometheus.NewRegistry())
		require.NoError(t, err)
		logger, hook := test.NewNullLogger()
		logger.SetLevel(logrus.DebugLevel)
		group := testenv.Name(t, "group")
		p := k.producer(t, func(c *txproducer.Config) {
			c.Group = group
			c.Metrics = m
			c.Logger = logger
		})
		ctx := context.Background()
		forced := func() float64 {
			return testutil.ToFloat64(m.ProducerSends.WithLabelValues(group, "OrderPlaced", "forced_rollback"))
		}

		for i, status := range forcedStatuses {
			id := fmt.Sprintf("forced-%d-%s", i, testenv.RandSuffix(8))
			require.NoError(t, k.b.StatusNext(k.topic, status))
			var runs atomic.Int32
			res, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
			require.ErrorIs(t, err, txproducer.ErrForcedRollback, "%s", status)
			require.ErrorIs(t, err, txproducer.ErrSend, "%s", status)
			require.Contains(t, err.Error(), "the broker stored the half but reported "+status.String())
			require.Contains(t, err.Error(), "the client ended the half with ROLLBACK and your function did not run")
			require.NotContains(t, err.Error(), `"order"`, "the error never quotes the payload")
			require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err), "%s", status)
			require.True(t, txproducer.IsRetryable(err), "%s", status)
			require.Equal(t, txproducer.StateRolledBack, res.State, "%s", status)
			require.Equal(t, id, res.EventID)
			require.False(t, res.Duplicate)
			require.Zero(t, runs.Load(), "%s: the function must not run", status)

			// Nothing committed anywhere.
			k.waitRolledBack(t, res.MsgID, status.String()+": the client's ROLLBACK of the stored half")
			require.False(t, k.pendingHalf(id), "%s: no half of %s left pending", status, id)
			require.Zero(t, k.copies(id), "%s: nothing on the topic", status)
			require.Zero(t, k.orderRows(t, id), "%s: no business row", status)
			k.requireNoTxlogRow(t, id, status.String()+": no txlog row (the early transaction was rolled back)")
			require.EqualValues(t, i+1, forced(), "%s: counted as forced_rollback", status)

			var warned []*logrus.Entry
			for _, e := range hook.AllEntries() {
				for _, v := range e.Data {
					require.NotContains(t, fmt.Sprint(v), `"order"`, "a log field carries the payload: %s", e.Message)
				}
				require.NotContains(t, e.Message, `"order"`, "a log line carries the payload")
				if e.Level == logrus.WarnLevel && e.Data["event_id"] == id {
					warned = append(warned, e)
				}
			}
			require.Len(t, warned, 1, "%s: one Warn line for %s", status, id)
			w := warned[0]
			require.Equal(t, status.String(), w.Data["broker_status"])
			require.Equal(t, res.MsgID, w.Data["half"])
			require.Equal(t, k.topic, w.Data["topic"])
			require.Equal(t, rmqtxtest.BrokerName, w.Data["broker"])
			require.True(t, strings.Contains(w.Message, status.String()) && strings.Contains(w.Message, "retry with the same event id"), w.Message)

			// The retry the advice asks for commits the id, once.
			again, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
			require.NoError(t, err, "%s: the retry", status)
			require.Equal(t, txproducer.StateCommitted, again.State)
			require.False(t, again.Duplicate)
			require.NotEqual(t, res.MsgID, again.MsgID)
			require.EqualValues(t, 1, runs.Load())
			require.Equal(t, again.MsgID, k.row(t, id).Half())
			require.Equal(t, txlog.StateCommitted, k.row(t, id).State)
			require.Equal(t, 1, k.orderRows(t, id))
			require.Equal(t, 1, k.copies(id))
		}
		require.EqualValues(t, len(forcedStatuses), testutil.ToFloat64(m.ProducerSends.WithLabelValues(group, "OrderPlaced", "committed")))
		require.Zero(t, testutil.ToFloat64(m.ProducerSends.WithLabelValues(group, "OrderPlaced", "error")), "a forced rollback is not counted as error")
		require.Empty(t, k.b.Pending())
		require.Zero(t, k.checkNow(t), "nothing left for a check")
	})
}

// The client ends the forced half with a one-way ROLLBACK whose failure it
// ignores. When that ROLLBACK is lost the half stays pending with no txlog
// row behind it: a check answers UNKNOWN while it is young, and once the
// advised retry has committed the id under its own half, the check answers
// the orphan ROLLBACK (another half committed the id). The orphan never
// commits: one copy of the event, one business row, the function run once.
func TestKitForcedRollbackEndLost(t *testing.T) {
	t.Parallel()
	kitEachDB(t, func(t *testing.T, k *kitBed) {
		p := k.producer(t, func(c *txproducer.Config) {
			// Long enough that the first check finds the orphan young
			// however slow the machine: the fence is not under test here.
			c.FenceAge = 60 * time.Second
		})
		ctx := context.Background()
		id := "forced-lost-" + testenv.RandSuffix(8)
		var runs atomic.Int32

		require.NoError(t, k.b.StatusNext(k.topic, rmqtxtest.SlaveNotAvailable))
		k.b.LoseEndTransaction(1)
		res, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
		require.ErrorIs(t, err, txproducer.ErrForcedRollback)
		require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err))
		require.Equal(t, txproducer.StateRolledBack, res.State)
		require.Zero(t, runs.Load())
		// The lost END is the only END so far: once the broker dropped it,
		// the half stays pending.
		testenv.Eventually(t, 10*time.Second, "the forced half pending (its ROLLBACK lost)", func() bool { return k.pendingHalf(id) })
		k.requireNoTxlogRow(t, id, "no txlog row behind the orphan half")
		require.Zero(t, k.orderRows(t, id))

		require.Equal(t, 1, k.checkNow(t))
		k.rec.require(t, id, answer(checkback.Unknown, checkback.ReasonYoung))

		again, err := p.Send(ctx, k.msg(id), kitOrder(id, &runs))
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, again.State)
		require.Equal(t, again.MsgID, k.row(t, id).Half())

		require.Equal(t, 1, k.checkNow(t), "the orphan is checked again")
		k.rec.require(t, id, answer(checkback.Unknown, checkback.ReasonYoung), answer(checkback.Rollback, checkback.ReasonOtherHalf))
		require.True(t, k.rolledBack(res.MsgID), "the orphan half rolled back")
		require.False(t, k.pendingHalf(id))
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, k.orderRows(t, id))
		require.Equal(t, 1, k.copies(id))
	})
}
