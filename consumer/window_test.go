package consumer

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/rmqtx/rmqtx/wire"
)

// qmsg is msg delivered from queue q of broker-a at offset off, as
// MessageFromExt names it.
func qmsg(id string, q int, off int64) Message {
	m := msg(ev(id, "Created"), fmt.Sprint(off))
	m.Delivery.BrokerName, m.Delivery.QueueID, m.Delivery.QueueOffset, m.Delivery.queueTopic = "broker-a", q, off, "t"
	return m
}

// TestWindowedDelivery: only a first delivery from a named queue of its
// own topic has a window; a retried message and one the caller built are
// counted.
func TestWindowedDelivery(t *testing.T) {
	t.Parallel()
	m := &primitive.MessageExt{QueueOffset: 7}
	m.Topic = "orders"
	m.Queue = &primitive.MessageQueue{Topic: "orders", BrokerName: "broker-b", QueueId: 3}
	k, ok := windowed(MessageFromExt(m).Delivery)
	require.True(t, ok)
	require.Equal(t, windowKey{topic: "orders", broker: "broker-b", queue: 3}, k)

	r := &primitive.MessageExt{QueueOffset: 7, ReconsumeTimes: 1}
	r.Topic = "%RETRY%grp"
	r.Queue = &primitive.MessageQueue{Topic: "%RETRY%grp", BrokerName: "broker-b", QueueId: 0}
	_, ok = windowed(MessageFromExt(r).Delivery)
	require.False(t, ok, "a retried message is counted")
	r.ReconsumeTimes = 0 // a batch-mode re-send: the broker's count stays 0
	_, ok = windowed(MessageFromExt(r).Delivery)
	require.False(t, ok, "a message from a retry queue is counted")

	_, ok = windowed(msg(ev("e", "Created"), "x").Delivery)
	require.False(t, ok, "a message the caller built is counted")
	m.Queue = nil
	_, ok = windowed(MessageFromExt(m).Delivery)
	require.False(t, ok, "a message without its queue is counted")
}

// A first delivery past its queue's window runs uncounted, after one window
// write per windowSpan offsets; a process that comes after it (as after a
// crash) counts every delivery up to the window, and past it counts none
// again; a process whose queue another process moved the window of counts
// up to the new window; batch mode does the same. Whether an attempt was
// counted is what the handler sees: the count commits before the handler's
// transaction begins.
func TestCrashWindow(t *testing.T) {
	t.Parallel()
	eachDB(t, testCrashWindow)
}

func testCrashWindow(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	var mu sync.Mutex
	counted := map[string]bool{}
	group := "g-" + wire.NewEventID()
	handler := func(ctx context.Context, tx *sqlx.Tx, e Event) error {
		var n int
		if err := tx.GetContext(ctx, &n, tx.Rebind("SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE consumer_group = ? AND event_id = ?"), group, e.ID); err != nil {
			return err
		}
		mu.Lock()
		counted[e.ID] = n == 1
		mu.Unlock()
		return effectHandler(ctx, tx, e)
	}
	proc := func() *Processor {
		return newProc(t, db, func(c *ProcessorConfig) {
			c.Group = group
			c.Routes = map[string]Route{"Created": {Handler: handler}}
		})
	}
	high := func(q int) int64 {
		var h int64
		require.NoError(t, db.Get(&h, db.Rebind("SELECT high_offset FROM rmqtx_consume_window WHERE consumer_group = ? AND topic = 't' AND broker_name = 'broker-a' AND queue_id = ?"), group, q))
		return h
	}
	// run processes offsets [from, to] of queue q on p (batch: 16 at a time
	// through ProcessBatch) and returns the offsets whose attempt was counted.
	run := func(p *Processor, q int, from, to int64, batch bool) []int64 {
		var ids []string
		var msgs []Message
		for off := from; off <= to; off++ {
			id := wire.NewEventID()
			ids = append(ids, id)
			msgs = append(msgs, qmsg(id, q, off))
		}
		if batch {
			for i := 0; i < len(msgs); i += 16 {
				for _, o := range p.ProcessBatch(ctx, msgs[i:min(i+16, len(msgs))]) {
					require.Equal(t, ResultApplied, o.Result, "%v", o.Err)
				}
			}
		} else {
			for _, m := range msgs {
				o := p.Process(ctx, m)
				require.Equal(t, ResultApplied, o.Result, "%v", o.Err)
			}
		}
		var out []int64
		mu.Lock()
		defer mu.Unlock()
		for i, id := range ids {
			ran, ok := counted[id]
			require.True(t, ok, "the handler ran for offset %d", from+int64(i))
			if ran {
				out = append(out, from+int64(i))
			}
		}
		return out
	}
	span := func(from, to int64) []int64 {
		var out []int64
		for o := from; o <= to; o++ {
			out = append(out, o)
		}
		return out
	}

	// A queue no process has seen: nothing counted, windows written at
	// offsets 0, 129 and 258 (each covers windowSpan offsets past its own).
	p1 := proc()
	require.Empty(t, run(p1, 1, 0, 299, false))
	require.EqualValues(t, 258+windowSpan, high(1))

	// The next process (as after a crash of p1): up to the window, counted;
	// past it, not, after one more window write.
	p2 := proc()
	require.Equal(t, span(300, 386), run(p2, 1, 300, 400, false))
	require.EqualValues(t, 387+windowSpan, high(1))

	// The queue comes back to p1, whose own window ended at 386: p2 may have
	// run handlers up to 515, so p1 counts those.
	require.Equal(t, span(401, 515), run(p1, 1, 401, 520, false))
	require.EqualValues(t, 516+windowSpan, high(1))

	// Batch mode, on another queue: a fresh queue counts nothing, the next
	// process counts up to the window.
	require.Empty(t, run(p1, 2, 0, 47, true))
	require.EqualValues(t, windowSpan, high(2))
	p3 := proc()
	require.Equal(t, span(48, 128), run(p3, 2, 48, 140, true))
	require.EqualValues(t, 129+windowSpan, high(2))

	// A retried message and one the caller built are counted, past any window.
	r := qmsg(wire.NewEventID(), 1, 10_000)
	r.Delivery.ReconsumeTimes = 1
	require.Equal(t, ResultApplied, p1.Process(ctx, r).Result)
	plain := msg(ev(wire.NewEventID(), "Created"), "plain")
	require.Equal(t, ResultApplied, p1.Process(ctx, plain).Result)
	mu.Lock()
	require.True(t, counted[r.Delivery.MsgID[len("m-"):]], "the retry was counted")
	require.True(t, counted[plain.Delivery.MsgID[len("m-"):]], "the caller's message was counted")
	mu.Unlock()
	require.EqualValues(t, 516+windowSpan, high(1), "a retry does not move the window")

	require.Zero(t, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE consumer_group = ?", group),
		"every counted success deleted its row")
	require.Equal(t, 300+101+120+48+93+2, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE consumer_group = ?", group))
}

// A database the consumer's schema step 2 has not reached: the windows turn
// off with one warning, and every attempt is counted, as before them.
func TestCrashWindowTableMissing(t *testing.T) {
	t.Parallel()
	eachDB(t, testCrashWindowTableMissing)
}

func testCrashWindowTableMissing(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	prefix := "nowin" + strings.ToLower(wire.NewEventID()[:6]) + "_"
	require.NoError(t, migrateTables(ctx, db, prefix))
	_, err := db.Exec("DROP TABLE " + prefix + WindowTable)
	require.NoError(t, err)
	logger, hook := logtest.NewNullLogger()
	var seen []bool
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.TablePrefix, c.Logger = prefix, logger
		c.Routes = map[string]Route{"Created": {Handler: func(ctx context.Context, tx *sqlx.Tx, e Event) error {
			var n int
			if err := tx.GetContext(ctx, &n, tx.Rebind("SELECT COUNT(*) FROM "+prefix+AttemptTable+" WHERE event_id = ?"), e.ID); err != nil {
				return err
			}
			seen = append(seen, n == 1)
			return effectHandler(ctx, tx, e)
		}}}
	})
	for off := range int64(3) {
		require.Equal(t, ResultApplied, p.Process(ctx, qmsg(wire.NewEventID(), 0, off)).Result)
	}
	require.Equal(t, []bool{true, true, true}, seen, "every attempt counted")
	var warns int
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel {
			warns++
			require.Contains(t, e.Message, "window table is missing")
		}
	}
	require.Equal(t, 1, warns, "one warning")
}
