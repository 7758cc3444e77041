package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/wire"
)

// benchEventType is the event type every workload publishes.
const benchEventType = "BenchEvent"

// sideRmqtxKeyed is the producer side of the README's recommended path: the
// event id derived from a business key (issue 25).
const sideRmqtxKeyed = "rmqtx Send, id from a business key"

// sideRawBatch is the consumer side that bounds batch mode: the raw
// handler's transaction taken once per handed-over batch, without dedup.
const sideRawBatch = "raw batch handler (no dedup)"

// propBenchID carries the event id on raw-side messages, as a service
// without rmqtx would add its own id property.
const propBenchID = "BENCH_ID"

// makePayload returns a payload of exactly size bytes that starts with a
// small JSON-ish header so payloads differ per message (hashing works on
// distinct data, as in production).
func makePayload(size int, seq int64) []byte {
	b := make([]byte, size)
	head := `{"order":` + strconv.FormatInt(seq, 10) + `,"pad":"`
	n := copy(b, head)
	for i := n; i < size; i++ {
		b[i] = 'a' + byte(i%26)
	}
	if size >= 2 && n < size-2 {
		b[size-2], b[size-1] = '"', '}'
	}
	return b
}

// rawMessage is what a service without rmqtx publishes: body, its own id
// property, the id as key, a tag.
func rawMessage(topic, id string, payload []byte) *primitive.Message {
	m := primitive.NewMessage(topic, payload)
	m.WithTag(benchEventType)
	m.WithKeys([]string{id})
	m.WithProperty(propBenchID, id)
	return m
}

// envelopeMessage is a message in rmqtx's wire format (what txproducer and
// the outbox publish), for preloading consumer topics and orphan halves.
// The properties go first: the client's WithProperties replaces the map,
// so set after them the tag and keys would be lost (they were until
// 2026-12-06), where txproducer's messages carry both.
func envelopeMessage(topic, id string, payload []byte) *primitive.Message {
	m := primitive.NewMessage(topic, payload)
	m.WithProperties(wire.Envelope{EventID: id, EventType: benchEventType}.Properties(payload))
	m.WithTag(benchEventType)
	m.WithKeys([]string{id})
	return m
}

// newRawProducer starts a normal producer with its own group and instance.
func (e *Env) newRawProducer(group string, retries int) (rmq.Producer, error) {
	p, err := rmq.NewProducer(
		producer.WithNsResolver(e.S.Resolver()),
		producer.WithGroupName(group),
		producer.WithInstanceName(group+"-"+randHex(6)),
		producer.WithRetry(retries),
	)
	if err != nil {
		return nil, fmt.Errorf("raw producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("raw producer start: %w", err)
	}
	return p, nil
}

// sendSync sends one message and checks the store status.
func sendSync(ctx context.Context, p rmq.Producer, m *primitive.Message) error {
	res, err := p.SendSync(ctx, m)
	if err != nil {
		return err
	}
	if res.Status != primitive.SendOK {
		return fmt.Errorf("send status %d", res.Status)
	}
	return nil
}

// preload publishes msgs with SendSync on concurrency goroutines.
func (e *Env) preload(ctx context.Context, p rmq.Producer, msgs []*primitive.Message) error {
	var (
		mu    sync.Mutex
		first error
		next  int
		wg    sync.WaitGroup
	)
	for w := 0; w < e.Opt.Concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				i := next
				next++
				stop := first != nil
				mu.Unlock()
				if stop || i >= len(msgs) {
					return
				}
				if err := sendSync(ctx, p, msgs[i]); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("preload message %d: %w", i, err)
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

// rawTxListener is the hand-written listener of a service without rmqtx:
// the local transaction does the business insert (no transaction log), and
// the check looks the business row up.
type rawTxListener struct {
	db        *sqlx.DB
	insert    string
	logInsert string // when set, a hand-written log row is inserted first
	check     string
	timeout   func() (context.Context, context.CancelFunc)
	// recs, when set, time each Send's local transaction (phases.go).
	recs rawRecs
	// checks counts the check-backs answered.
	checks atomic.Int64
}

func (l *rawTxListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	ctx, cancel := l.timeout()
	defer cancel()
	var rec *rawRec
	if l.recs != nil {
		if rec = l.recs.find(m); rec != nil {
			rec.local0 = time.Now()
		}
	}
	id := m.GetProperty(propBenchID)
	tx, err := l.db.BeginTxx(ctx, nil)
	if err != nil {
		return primitive.RollbackMessageState
	}
	if l.logInsert != "" {
		if _, err := tx.ExecContext(ctx, l.logInsert, id, m.Topic, m.Body); err != nil {
			_ = tx.Rollback()
			return primitive.RollbackMessageState
		}
	}
	if rec != nil {
		rec.pre = time.Now()
	}
	if _, err := tx.ExecContext(ctx, l.insert, id, int64(len(m.Body)), m.Body); err != nil {
		_ = tx.Rollback()
		return primitive.RollbackMessageState
	}
	if rec != nil {
		rec.fn = time.Now()
	}
	if err := tx.Commit(); err != nil {
		return primitive.RollbackMessageState
	}
	if rec != nil {
		rec.commit, rec.stamped = time.Now(), true
	}
	return primitive.CommitMessageState
}

func (l *rawTxListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	l.checks.Add(1)
	ctx, cancel := l.timeout()
	defer cancel()
	var n int
	if err := l.db.GetContext(ctx, &n, l.check, m.GetProperty(propBenchID)); err != nil {
		return primitive.UnkonwnState
	}
	if n > 0 {
		return primitive.CommitMessageState
	}
	return primitive.UnkonwnState
}

// rawPushConsumer starts a push consumer (clustering, concurrent, batch 1,
// from the first offset) that calls handle for each message.
func (e *Env) rawPushConsumer(group, topic string, goroutines int,
	handle func(ctx context.Context, m *primitive.MessageExt) error) (rmq.PushConsumer, error) {
	return e.rawBatchConsumer(group, topic, goroutines, 1, func(ctx context.Context, msgs []*primitive.MessageExt) error {
		for _, m := range msgs {
			if err := handle(ctx, m); err != nil {
				return err
			}
		}
		return nil
	})
}

// rawBatchConsumer is rawPushConsumer handing over up to batch messages of
// one queue at once (ConsumeMessageBatchMaxSize).
func (e *Env) rawBatchConsumer(group, topic string, goroutines, batch int,
	handle func(ctx context.Context, msgs []*primitive.MessageExt) error) (rmq.PushConsumer, error) {
	pc, err := rmq.NewPushConsumer(
		rmqconsumer.WithGroupName(group),
		rmqconsumer.WithInstance(group+"-"+randHex(6)),
		rmqconsumer.WithNsResolver(e.S.Resolver()),
		rmqconsumer.WithConsumeFromWhere(rmqconsumer.ConsumeFromFirstOffset),
		rmqconsumer.WithConsumeGoroutineNums(goroutines),
		rmqconsumer.WithConsumeMessageBatchMaxSize(batch),
	)
	if err != nil {
		return nil, fmt.Errorf("raw consumer: %w", err)
	}
	err = pc.Subscribe(topic, rmqconsumer.MessageSelector{}, func(ctx context.Context, msgs ...*primitive.MessageExt) (rmqconsumer.ConsumeResult, error) {
		if err := handle(ctx, msgs); err != nil {
			return rmqconsumer.ConsumeRetryLater, err
		}
		return rmqconsumer.ConsumeSuccess, nil
	})
	if err != nil {
		return nil, fmt.Errorf("raw consumer subscribe: %w", err)
	}
	if err := pc.Start(); err != nil {
		_ = pc.Shutdown()
		return nil, fmt.Errorf("raw consumer start: %w", err)
	}
	return pc, nil
}
