//go:build failpoints

package faultsuite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/wire"
)

const (
	stormCopies    = 4 // each event is published this many times
	stormInstances = 3 // consumer instances of one group
	stormRacers    = 6 // processors racing on the same message
)

// TestDuplicateStorm publishes every event stormCopies times (consecutive
// sends land on different queues, so the copies reach different consumer
// instances at the same moment) to stormInstances consumers of one group.
// Then it makes stormRacers processors (separate instances of the same group
// on the same database) process the very same message at the same instant;
// every tenth event races two payloads under one id (a protocol conflict).
// Each event has exactly one effect; conflicts are parked, never applied.
//
// It runs on MariaDB and on PostgreSQL (subtests "mysql" and "postgres").
func TestDuplicateStorm(t *testing.T) {
	t.Parallel()
	eachDB(t, "duplicate-storm", duplicateStorm)
}

func duplicateStorm(t *testing.T, b *bed) {
	for i := 0; i < stormInstances; i++ {
		b.StartConsumer(t, fmt.Sprintf("storm-%d", i))
	}

	// 1. Through the broker.
	p := testenv.Producer(t)

	n := cfg.storm
	ids := make([]string, n)
	for i := range ids {
		ids[i] = wire.NewEventID()
		b.Publish(ids[i])
		b.Record(&testbed.Attempt{ID: ids[i], Source: "storm", Answered: true})
	}
	insertOrders(t, b, ids, "storm")
	work := make(chan string)
	var wg sync.WaitGroup
	var sendErr error
	var mu sync.Mutex
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				body := testbed.Payload(id)
				props := wire.Envelope{EventID: id, EventType: testbed.EventType}.Properties(body)
				for c := 0; c < stormCopies; c++ {
					m := primitive.NewMessage(b.Topic, body)
					m.WithProperties(props)
					m.WithKeys([]string{id})
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := p.SendSync(ctx, m)
					cancel()
					if err != nil {
						mu.Lock()
						sendErr = err
						mu.Unlock()
					}
				}
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	require.NoError(t, sendErr)

	// 2. Racing processors, no broker: the same message at the same instant.
	procs := make([]*consumer.Processor, stormRacers)
	for i := range procs {
		var err error
		procs[i], err = consumer.NewProcessor(testbed.ConsumerConfig(b.DB, b.S.NameServer, b.Topic, b.CGroup, fmt.Sprintf("racer-%d", i)).Processing())
		require.NoError(t, err)
	}
	b.AddProcessors(procs...)
	races := n / 2
	if races < 20 {
		races = 20
	}
	var applied, dups, conflicts, conflictIDs int
	for r := 0; r < races; r++ {
		id := wire.NewEventID()
		conflict := r%10 == 9
		b.Publish(id)
		b.Direct(id)
		b.Record(&testbed.Attempt{ID: id, Source: "race", Answered: true})
		insertOrders(t, b, []string{id}, "race")
		outcomes := make([]consumer.Outcome, stormRacers)
		gate := make(chan struct{})
		var rw sync.WaitGroup
		for i := range procs {
			body := testbed.Payload(id)
			if conflict && i%2 == 1 {
				body = []byte(`{"order":"` + id + `","amount":43}`)
			}
			m := consumer.Message{Body: body, Properties: wire.Envelope{EventID: id, EventType: testbed.EventType}.Properties(body),
				Delivery: consumer.Delivery{Topic: b.Topic, MsgID: fmt.Sprintf("race-%d-%d", r, i), StoredAt: time.Now().UTC()}}
			rw.Add(1)
			go func() {
				defer rw.Done()
				<-gate
				outcomes[i] = procs[i].Process(context.Background(), m)
			}()
		}
		close(gate)
		rw.Wait()
		a, c := 0, 0
		for _, o := range outcomes {
			switch o.Result {
			case consumer.ResultApplied:
				a++
			case consumer.ResultDuplicate:
				dups++
			case consumer.ResultConflict:
				conflicts++
				c++
			default:
				t.Fatalf("race %d: unexpected outcome %+v", r, o)
			}
		}
		require.Equal(t, 1, a, "exactly one of %d racing processors applies event %s", stormRacers, id)
		applied += a
		if c > 0 {
			conflictIDs++ // one dead letter per (group, event id, payload hash)
		}
	}
	b.ExpectParked(conflictIDs)
	require.Positive(t, conflicts, "the raced payload conflicts were detected")

	b.Sc.Note("%d events x %d copies to %d consumer instances; %d events raced by %d processors (%d applied, %d dedup hits, %d payload conflicts parked)",
		n, stormCopies, stormInstances, races, stormRacers, applied, dups, conflicts)
	b.Verify(t, 4*time.Minute)

	var brokerDups int64
	for _, c := range b.Consumers() {
		brokerDups += c.Processor().Stats().Duplicates
	}
	require.GreaterOrEqual(t, brokerDups, int64(n*(stormCopies-1)), "every extra copy was absorbed as a dedup hit")
}

func insertOrders(t *testing.T, b *bed, ids []string, source string) {
	t.Helper()
	for _, id := range ids {
		_, err := b.DB.Exec(b.DB.Rebind("INSERT INTO orders (event_id, source) VALUES (?, ?)"), id, source)
		require.NoError(t, err)
	}
}
