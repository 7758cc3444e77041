package conformance

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// scenario is one behaviour both backends must show.
type scenario struct {
	name string
	own  bool // needs a broker of its own (openOpts.own)
	run  func(t *testing.T, b Backend)
}

var scenarios = []scenario{
	{name: "half_commit", run: halfCommit},
	{name: "half_rollback", run: halfRollback},
	{name: "check_commit", run: func(t *testing.T, b Backend) { checkAnswer(t, b, primitive.CommitMessageState) }},
	{name: "check_rollback", run: func(t *testing.T, b Backend) { checkAnswer(t, b, primitive.RollbackMessageState) }},
	{name: "check_unknown", run: func(t *testing.T, b Backend) { checkAnswer(t, b, primitive.UnkonwnState) }},
	{name: "lost_end_transaction", run: lostEndTransaction},
	{name: "redelivery", run: redelivery},
	{name: "reconsume_limit", run: reconsumeLimit},
	{name: "queue_order", run: queueOrder},
	{name: "restart", own: true, run: restart},
	{name: "missing_topic", own: true, run: missingTopic},
}

// TestConformance runs every scenario on every backend:
// TestConformance/<backend>/<scenario>. The backends, and the scenarios of
// one backend, run in parallel, each scenario on its own topics and groups.
func TestConformance(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			t.Parallel()
			k := kind.open(t) // bound to this subtest: what its scenarios share ends with it
			for _, sc := range scenarios {
				t.Run(sc.name, func(t *testing.T) {
					t.Parallel()
					sc.run(t, k.open(t, openOpts{own: sc.own}))
				})
			}
		})
	}
}

// body is a message body unique to the test.
func body(what string) string {
	return what + "-" + testenv.RandSuffix(12)
}

// settle proves that nothing more of topic's queue 0 is on its way to s:
// it sends a marker to queue 0 after everything else, waits for the
// marker, then for every queue offset below the marker's: every message
// the broker stored on the queue before the marker has then been handed to
// s's callback (a concurrent consumer may run the marker's callback before
// an earlier message's). The scenarios that use it send on one-queue
// topics, so queue 0 is every message's queue.
func settle(t testing.TB, b Backend, s *sink, topic string) {
	t.Helper()
	p := newProducer(t, b)
	marker := body("marker")
	send(t, p, primitive.NewMessage(topic, []byte(marker)))
	s.awaitBody(t, marker, 1)
	m := s.of(marker)[0]
	s.await(t, fmt.Sprintf("every offset of %s below the marker's (%d)", topic, m.Offset), func(ds []delivery) bool {
		seen := map[int64]bool{}
		for _, d := range ds {
			if d.Topic == topic && d.Queue == m.Queue && d.Reconsume == 0 {
				seen[d.Offset] = true
			}
		}
		for o := int64(0); o < m.Offset; o++ {
			if !seen[o] {
				return false
			}
		}
		return true
	})
}

// A half committed by the local transaction's answer is delivered once; a
// half rolled back is never delivered.
func halfCommit(t *testing.T, b Backend) {
	topic := testenv.Name(t, "t")
	b.CreateTopic(t, topic, 1)
	s := consume(t, b, topic, sinkOpts{})
	p := newTxProducer(t, b, newListener(primitive.CommitMessageState, primitive.CommitMessageState))
	m := body("commit")
	sendHalf(t, p, topic, m)
	s.awaitBody(t, m, 1)
	settle(t, b, s, topic)
	require.Equal(t, 1, s.count(m), "a committed half is delivered once")
}

func halfRollback(t *testing.T, b Backend) {
	topic := testenv.Name(t, "t")
	b.CreateTopic(t, topic, 1)
	s := consume(t, b, topic, sinkOpts{})
	l := newListener(primitive.RollbackMessageState, primitive.RollbackMessageState)
	p := newTxProducer(t, b, l)
	m := body("rollback")
	sendHalf(t, p, topic, m)
	settle(t, b, s, topic)
	require.Zero(t, s.count(m), "a rolled-back half is never delivered")
}

// The local transaction answers UNKNOWN, so the half stays pending (not
// delivered) until the broker checks it; the check's answer then decides:
// COMMIT delivers it once, ROLLBACK never, UNKNOWN leaves it pending and the
// broker checks again.
func checkAnswer(t *testing.T, b Backend, answer primitive.LocalTransactionState) {
	topic := testenv.Name(t, "t")
	b.CreateTopic(t, topic, 1)
	s := consume(t, b, topic, sinkOpts{})
	// Checks answer UNKNOWN until the half is proved pending.
	l := newListener(primitive.UnkonwnState, primitive.UnkonwnState)
	p := newTxProducer(t, b, l)
	m := body("check")
	sendHalf(t, p, topic, m)
	settle(t, b, s, topic)
	require.Zero(t, s.count(m), "a half answered UNKNOWN is not delivered before a check decides it")

	l.setAnswer(answer)
	switch answer {
	case primitive.CommitMessageState:
		b.CheckUntil(t, "a check answered COMMIT to deliver the half", func() bool { return s.count(m) >= 1 })
		require.Positive(t, l.checks(primitive.CommitMessageState))
		settle(t, b, s, topic)
		require.Equal(t, 1, s.count(m), "a half committed by a check is delivered once")
	case primitive.RollbackMessageState:
		b.CheckUntil(t, "a check answered ROLLBACK", func() bool { return l.checks(primitive.RollbackMessageState) >= 1 })
		settle(t, b, s, topic)
		require.Zero(t, s.count(m), "a half rolled back by a check is never delivered")
	case primitive.UnkonwnState:
		n := l.checks(primitive.UnkonwnState)
		b.CheckUntil(t, "two more checks of a half answered UNKNOWN", func() bool {
			return l.checks(primitive.UnkonwnState) >= n+2
		})
		settle(t, b, s, topic)
		require.Zero(t, s.count(m), "a half answered UNKNOWN stays pending")
		// It is still the check's to decide: end it.
		l.setAnswer(primitive.CommitMessageState)
		b.CheckUntil(t, "a later check answered COMMIT to deliver the half", func() bool { return s.count(m) >= 1 })
		settle(t, b, s, topic)
		require.Equal(t, 1, s.count(m))
	}
}

// The local transaction commits, but its END_TRANSACTION never reaches
// the broker: the half stays pending, undelivered, and the check decides.
func lostEndTransaction(t *testing.T, b Backend) {
	topic := testenv.Name(t, "t")
	b.CreateTopic(t, topic, 1)
	s := consume(t, b, topic, sinkOpts{})
	l := newListener(primitive.CommitMessageState, primitive.UnkonwnState)
	if !b.LoseEndTransaction(1) {
		// The real broker has no way to lose a request; UNKNOWN from execute
		// reaches the same state, and the broker cannot tell a lost END from
		// an UNKNOWN one: either way it holds a pending half and checks it.
		l.exec = primitive.UnkonwnState
	}
	p := newTxProducer(t, b, l)
	m := body("lostend")
	sendHalf(t, p, topic, m)
	settle(t, b, s, topic)
	require.Zero(t, s.count(m), "a half whose END was lost is not delivered before a check")

	l.setAnswer(primitive.CommitMessageState)
	b.CheckUntil(t, "the check to commit the half", func() bool { return s.count(m) >= 1 })
	require.Positive(t, l.checks(primitive.CommitMessageState))
	settle(t, b, s, topic)
	require.Equal(t, 1, s.count(m), "delivered once, by the check's COMMIT")
}

// createRetryTopic creates group's retry topic (%RETRY%group) before its
// consumer starts, as rmqtx's consumer does: the broker creates it at the
// group's first heartbeat, after the client read its routes, and the
// client reads routes again only every 30 s, so the first retries of a new
// group would wait that long.
func createRetryTopic(t testing.TB, b Backend, group string) {
	t.Helper()
	b.CreateTopic(t, "%RETRY%"+group, 1)
}

// A consume that fails once (RetryLater) is delivered again, with
// ReconsumeTimes 1, under its own topic's name.
func redelivery(t *testing.T, b Backend) {
	topic := testenv.Name(t, "t")
	group := testenv.Name(t, "cg")
	b.CreateTopic(t, topic, 1)
	createRetryTopic(t, b, group)
	s := consume(t, b, topic, sinkOpts{group: group, fail: func(d delivery) bool { return d.Reconsume == 0 }})
	m := body("retry")
	send(t, newProducer(t, b), primitive.NewMessage(topic, []byte(m)))
	s.awaitBody(t, m, 2)
	got := s.of(m)
	require.Equal(t, int32(0), got[0].Reconsume)
	require.Equal(t, int32(1), got[1].Reconsume, "the redelivery counts one reconsume")
	require.Equal(t, topic, got[1].Topic, "the client gives a retried message its own topic back")
}

// A consume that always fails is delivered maxReconsumeTimes+1 times, then
// the broker moves the message to the group's dead-letter queue %DLQ%group.
func reconsumeLimit(t *testing.T, b Backend) {
	const maxReconsume = 1
	topic := testenv.Name(t, "t")
	group := testenv.Name(t, "cg")
	dlq := "%DLQ%" + group
	b.CreateTopic(t, topic, 1)
	createRetryTopic(t, b, group)
	s := consume(t, b, topic, sinkOpts{group: group, maxReconsume: maxReconsume, fail: func(delivery) bool { return true }})
	m := body("dead")
	send(t, newProducer(t, b), primitive.NewMessage(topic, []byte(m)))

	// An admin read first: the dead-letter topic exists, with a message,
	// once the broker moved the message there; a consumer can only be
	// routed to it then.
	ctx, cancel := context.WithTimeout(context.Background(), deliveryBound)
	defer cancel()
	testenv.Eventually(t, deliveryBound, "a message in "+dlq, func() bool {
		n, err := remoting.MaxOffset(ctx, b.BrokerAddr(), 5*time.Second, dlq, 0)
		return err == nil && n >= 1
	})
	got := s.of(m)
	require.Len(t, got, maxReconsume+1, "delivered once and reconsumed maxReconsumeTimes times: %+v", got)
	for i, d := range got {
		require.Equal(t, int32(i), d.Reconsume)
	}
	d := consume(t, b, dlq, sinkOpts{})
	d.awaitBody(t, m, 1)
}

// Messages sent to one queue (a queue selector) are stored, and reach a
// consumer, in the order they were sent: their queue offsets follow the
// send order. The order is judged by queue offset, with a concurrent
// consumer: the client's orderly push consumer has data races of its own
// (the race detector reports processQueue.takeMessages against
// putMessage), and the queue's order is the broker's to keep; the order in
// which a client runs its callbacks is the client's.
func queueOrder(t *testing.T, b Backend) {
	const n = 20
	topic := testenv.Name(t, "t")
	b.CreateTopic(t, topic, 4)
	s := consume(t, b, topic, sinkOpts{})
	p := newProducer(t, b, producer.WithQueueSelector(producer.NewHashQueueSelector()))
	prefix := body("ordered")
	want := make([]string, n)
	queue := -1
	for i := range want {
		want[i] = prefix + "-" + strconv.Itoa(i)
		msg := primitive.NewMessage(topic, []byte(want[i]))
		msg.WithShardingKey("one-key")
		res := send(t, p, msg)
		if queue < 0 {
			queue = res.MessageQueue.QueueId
		}
		require.Equal(t, queue, res.MessageQueue.QueueId, "the selector sends every message to one queue")
	}
	s.await(t, fmt.Sprintf("%d deliveries", n), func(ds []delivery) bool { return len(ds) >= n })
	got := s.deliveries()
	require.Len(t, got, n, "each message once")
	sort.Slice(got, func(i, j int) bool { return got[i].Offset < got[j].Offset })
	for i, d := range got {
		require.Equal(t, want[i], d.Body, "the message at the queue's offset %d", d.Offset)
		require.Equal(t, queue, d.Queue)
		require.Equal(t, got[0].Offset+int64(i), d.Offset, "consecutive offsets: nothing else in the queue")
	}
}

// restartBound bounds the first delivery after a restart: the client's
// pull timeout (30 s) plus its retry delay after an error (3 s), with room.
const restartBound = 45 * time.Second

// A broker restart under a live producer and consumer: both keep working
// afterwards. Only "at least once" is asserted for the message sent after
// the restart: a send retried across the restart may store it twice.
func restart(t *testing.T, b Backend) {
	topic := testenv.Name(t, "t")
	b.CreateTopic(t, topic, 2)
	s := consume(t, b, topic, sinkOpts{})
	p := newProducer(t, b)
	before := body("before")
	send(t, p, primitive.NewMessage(topic, []byte(before)))
	s.awaitBody(t, before, 1)

	b.Restart(t)
	restarted := time.Now()

	// The producer reconnects on its next send; until the broker's
	// registration reaches the producer's route the send may fail: retry
	// until one succeeds, bounded.
	after := body("after")
	var lastErr error
	if !testenv.Await(deliveryBound, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		res, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte(after)))
		if err == nil && res.Status != primitive.SendOK {
			err = fmt.Errorf("status %v", res.Status)
		}
		lastErr = err
		return err == nil
	}) {
		t.Fatalf("no send succeeded within %s of the restart: %v", deliveryBound, lastErr)
	}
	sent := time.Now()
	// The consumer's pull that was in flight when the connection dropped
	// fails only at the client's own pull timeout (30 s), and the client
	// pulls again 3 s later: on both backends the delivery may take that
	// long (a pull the broker still held is answered, and retried sooner).
	s.awaitWithin(t, restartBound, "delivery of "+after, func([]delivery) bool { return s.count(after) >= 1 })
	t.Logf("after the restart: a send succeeded in %s, delivered %s later", sent.Sub(restarted).Round(10*time.Millisecond),
		time.Since(sent).Round(10*time.Millisecond))
}

// A send to a topic nobody created, on a broker that does not create
// topics on first use, fails: the name server answers the route request
// with TOPIC_NOT_EXIST (17), the client's send fails, and a send straight
// to the broker is refused with TOPIC_NOT_EXIST too.
func missingTopic(t *testing.T, b Backend) {
	topic := testenv.Name(t, "missing")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	_, err := remoting.TopicRoute(ctx, b.NameServers(), 5*time.Second, topic)
	require.ErrorIs(t, err, remoting.ErrTopicNotFound, "the name server answers TOPIC_NOT_EXIST")

	p := newProducer(t, b)
	_, err = p.SendSync(ctx, primitive.NewMessage(topic, []byte(body("lost"))))
	require.Error(t, err, "a send to a missing topic fails")
	require.Contains(t, err.Error(), topic)

	// The request the client would send, had it a route: SEND_MESSAGE (10).
	code, remark, err := rawRequest(ctx, b.BrokerAddr(), 10, []byte("x"), map[string]string{
		"producerGroup":         testenv.Name(t, "pub"),
		"topic":                 topic,
		"defaultTopic":          "TBW102",
		"defaultTopicQueueNums": "4",
		"queueId":               "0",
		"sysFlag":               "0",
		"bornTimestamp":         strconv.FormatInt(time.Now().UnixMilli(), 10),
		"flag":                  "0",
		"properties":            "",
		"reconsumeTimes":        "0",
		"unitMode":              "false",
		"batch":                 "false",
	})
	require.NoError(t, err)
	require.Equal(t, remoting.ResTopicNotExist, code, "the broker refuses the send: %s", remark)

	// Once created, the topic takes sends.
	b.CreateTopic(t, topic, 1)
	s := consume(t, b, topic, sinkOpts{})
	m := body("found")
	send(t, newProducer(t, b), primitive.NewMessage(topic, []byte(m)))
	s.awaitBody(t, m, 1)
}
