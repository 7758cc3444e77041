package testenv_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// TestClientShutdownUnderLoadIsRaceFree is the regression test for the
// patched client (third_party/rocketmq-client-go/PATCHES.md). It does what
// trips the upstream client's own data races under -race: push consumers
// that are shut down at once after Start, while their rebalance and pull
// goroutines run, and producers shut down while sends are in flight. With
// the upstream client the race detector fails this test (measured in
// PATCHES.md); with the patch it must pass. Under -race any report fails it.
func TestClientShutdownUnderLoadIsRaceFree(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	const rounds = 6
	var wg sync.WaitGroup
	for i := 0; i < rounds; i++ {
		wg.Add(2)
		go func(i int) {
			defer wg.Done()
			group := fmt.Sprintf("%s-%d", testenv.Name(t, "cg"), i)
			c, err := rocketmq.NewPushConsumer(
				consumer.WithGroupName(group),
				consumer.WithInstance(group),
				consumer.WithNsResolver(s.NameServerResolver()),
			)
			require.NoError(t, err)
			require.NoError(t, c.Subscribe(topic, consumer.MessageSelector{}, func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
				return consumer.ConsumeSuccess, nil
			}))
			require.NoError(t, c.Start())
			require.NoError(t, c.Shutdown())
		}(i)
		go func(i int) {
			defer wg.Done()
			group := fmt.Sprintf("%s-%d", testenv.Name(t, "pg"), i)
			p, err := rocketmq.NewProducer(
				producer.WithGroupName(group),
				producer.WithInstanceName(group),
				producer.WithNsResolver(s.NameServerResolver()),
			)
			require.NoError(t, err)
			require.NoError(t, p.Start())
			var sends sync.WaitGroup
			for j := 0; j < 4; j++ {
				sends.Add(1)
				go func() {
					defer sends.Done()
					// Errors are expected once Shutdown has run; only the
					// race detector's verdict matters here.
					_, _ = p.SendSync(context.Background(), primitive.NewMessage(topic, []byte("x")))
				}()
			}
			require.NoError(t, p.Shutdown())
			sends.Wait()
		}(i)
	}
	wg.Wait()
}

// TestPushConsumerShutdownWhileDeliveringIsRaceFree is the regression test
// for patch 3 (PATCHES.md): push consumers shut down while messages keep
// arriving, so that pull goroutines are handing a batch to their process
// queue while Shutdown runs. Upstream closes the queue's message channel in
// Shutdown while putMessage may still send on it: the race detector reports
// the close against the send (soak 7, TESTING.md), and without -race the same
// interleaving can panic with "send on closed channel", because the send
// sits in a select whose other case (the queue's close channel) is closed
// too. Sixteen consumers of an eight-queue topic are shut down at once in
// each of ten rounds, each at a moment when it is receiving.
func TestPushConsumerShutdownWhileDeliveringIsRaceFree(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 8)
	p := testenv.Producer(t)

	// A steady stream into the topic until the test ends.
	stop := make(chan struct{})
	var senders sync.WaitGroup
	var sent atomic.Int64
	for g := 0; g < 4; g++ {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte("x"))); err == nil {
					sent.Add(1)
				}
			}
		}()
	}
	defer func() { close(stop); senders.Wait() }()

	const rounds, consumers = 10, 16
	for r := 0; r < rounds; r++ {
		cs := make([]rocketmq.PushConsumer, consumers)
		got := make([]atomic.Int64, consumers)
		for i := range cs {
			group := fmt.Sprintf("%s-%d-%d", testenv.Name(t, "cg"), r, i)
			c, err := rocketmq.NewPushConsumer(
				consumer.WithGroupName(group),
				consumer.WithInstance(group),
				consumer.WithNsResolver(s.NameServerResolver()),
				consumer.WithConsumeFromWhere(consumer.ConsumeFromLastOffset),
				consumer.WithPullBatchSize(1),
			)
			require.NoError(t, err)
			n := &got[i]
			require.NoError(t, c.Subscribe(topic, consumer.MessageSelector{}, func(_ context.Context, ms ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
				n.Add(int64(len(ms)))
				return consumer.ConsumeSuccess, nil
			}))
			require.NoError(t, c.Start())
			cs[i] = c
		}
		// Every consumer is receiving: its pull goroutines are busy.
		testenv.Eventually(t, 60*time.Second, "every consumer to receive 20 messages", func() bool {
			for i := range got {
				if got[i].Load() < 20 {
					return false
				}
			}
			return true
		})
		errs := make(chan error, consumers)
		var wg sync.WaitGroup
		for _, c := range cs {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- c.Shutdown() }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	require.Positive(t, sent.Load())
}

// TestRequestEndsWhenItsConnectionBreaks is the regression test of patch 7
// (third_party/rocketmq-client-go/PATCHES.md): a request whose connection
// breaks before the response must end at once, with an error, instead of
// waiting out its timeout. A long-polling pull to a broker that died waited
// 30 s that way, so a push consumer resumed on a promoted master only then.
// A TCP server here reads the request and closes the connection without an
// answer, 200 ms after reading the whole frame (a broker that held the
// request, then died); the request (an admin CreateTopic, bounded by a 5 s context) must
// fail within 2 s naming the broken connection. On the upstream client it
// waits the whole 5 s: that is asserted too, so the test says which client
// it ran against. No database and no broker take part.
func TestRequestEndsWhenItsConnectionBreaks(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				// Read the whole request frame (a 4-byte length, then that
				// many bytes), so the client has written all of it, then close
				// without an answer.
				var hdr [4]byte
				if _, err := io.ReadFull(c, hdr[:]); err == nil {
					_, _ = io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(hdr[:])))
				}
				// The fault: a broker that held the request (a long poll)
				// dies a moment later. The hold lets the upstream client's
				// last, empty write of the frame finish first; a close before
				// it fails that write at once, which is not the case tested.
				time.Sleep(200 * time.Millisecond)
				_ = c.Close()
			}()
		}
	}()
	a, err := admin.NewAdmin(admin.WithResolver(primitive.NewPassthroughResolver([]string{"127.0.0.1:1"})))
	require.NoError(t, err)
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err = a.CreateTopic(ctx, admin.WithTopicCreate(testenv.Name(t, "topic")), admin.WithBrokerAddrCreate(ln.Addr().String()))
	took := time.Since(start)
	require.Error(t, err, "nothing answered the request")
	t.Logf("the request ended after %s: %v", took.Round(time.Millisecond), err)
	if testenv.PatchedClient() {
		require.Less(t, took, 2*time.Second, "the patched client ends the request when its connection breaks")
		require.ErrorContains(t, err, "broke before the response")
	} else {
		require.GreaterOrEqual(t, took, 4*time.Second, "the upstream client waits out the request's timeout (the bug patch 7 fixes)")
	}
}

// TestFirstConcurrentSendsFindTheRoute is patch 9's regression test
// (third_party/rocketmq-client-go/PATCHES.md): the first sends of a fresh
// producer to a fresh topic, many at once, with the raw client (no rmqtx
// seam in between). The upstream client hands a topic's queues to its
// producers before it records the addresses of the topic's brokers, so a
// send that sees the queues in that moment finds no address and fails with
// "topic=... route info not found" (measured in PATCHES.md); patched, every
// send must succeed.
func TestFirstConcurrentSendsFindTheRoute(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	const rounds, senders, stagger = 40, 32, 10 * time.Microsecond
	for r := 0; r < rounds; r++ {
		topic := fmt.Sprintf("%s_%d", testenv.Name(t, "topic"), r)
		testenv.CreateTopic(t, topic, 1) // one queue: the race is per topic, and a queue holds a broker file open
		group := fmt.Sprintf("%s-%d", testenv.Name(t, "pg"), r)
		p, err := rocketmq.NewProducer(
			producer.WithGroupName(group),
			producer.WithInstanceName(group),
			producer.WithNsResolver(s.NameServerResolver()),
			producer.WithRetry(0),
		)
		require.NoError(t, err)
		require.NoError(t, p.Start())
		failed, first := testenv.StaggeredSends(senders, stagger, func(int) error {
			_, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte("x")))
			return err
		})
		require.NoError(t, p.Shutdown())
		require.Zero(t, failed, "round %d: %d of %d first sends failed, the first with: %v", r, failed, senders, first)
	}
}
