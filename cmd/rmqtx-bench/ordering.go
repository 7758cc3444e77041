package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// The ordering workload: what per-aggregate ordering (WIRE.md, "Queue
// routing"; package consumer, "Order") costs. The consumer keeps the order
// of the events of one routing key and registers nothing for an event
// without one, so the same consumer drains events without a key (no
// ordering: what it did before), with an aggregate per event (ordering's
// bookkeeping, never a wait), with a few aggregates (events wait for the
// one before them of their aggregate) and with one aggregate (every event
// waits: one queue, applied one at a time). The producer side sends with
// and without a routing key: the queue selector's hash, and for one
// aggregate every Send on one queue.
const (
	sideOrdNone   = "consumer, no routing key (unordered)"
	sideOrdEach   = "consumer, an aggregate per event"
	sideOrdFew    = "consumer, 16 aggregates"
	sideOrdOne    = "consumer, one aggregate"
	sideSendNone  = "Send, no routing key"
	sideSendEach  = "Send, an aggregate per event"
	sideSendOne   = "Send, one aggregate"
	orderingFew   = 16 // aggregates of sideOrdFew
	orderingQueue = 4  // queues of every ordering topic
)

// orderKeys says which aggregate the i-th event of a side belongs to: ""
// for none.
func orderKeys(side string, run string, i int) string {
	switch side {
	case sideOrdEach, sideSendEach:
		return fmt.Sprintf("%s-%d", run, i)
	case sideOrdFew:
		return fmt.Sprintf("%s-%d", run, i%orderingFew)
	case sideOrdOne, sideSendOne:
		return run + "-all"
	}
	return ""
}

// orderedMessage is the i-th preloaded event of side: the rmqtx envelope
// with its aggregate, routed as txproducer routes it.
func orderedMessage(topic, side, run string, i int, version int64, payload []byte) *primitive.Message {
	env := wire.Envelope{EventID: fmt.Sprintf("%s-%06d", topic, i), EventType: benchEventType}
	if agg := orderKeys(side, run, i); agg != "" {
		env.AggregateType, env.AggregateID, env.AggregateVersion = "Order", agg, version
	}
	m := primitive.NewMessage(topic, payload)
	m.WithTag(benchEventType)
	m.WithKeys([]string{env.EventID})
	m.WithProperties(env.Properties(payload))
	rmqroute.SetKey(m, env)
	return m
}

// orderCheck records, per consumer group and routing key, the queue and
// offset of the last event applied, and counts events applied behind a
// later one of their key or off their key's queue.
type orderCheck struct {
	mu        sync.Mutex
	last      map[string]int64
	behind    int64 // applied after a later event of their key
	misrouted int64 // not on wire.QueueFor's queue
}

func (c *orderCheck) apply(group string, ev consumer.Event) {
	key := wire.RoutingKey(ev.AggregateType, ev.AggregateID, ev.BusinessKey)
	if key == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if ev.Delivery.QueueID != wire.QueueFor(key, orderingQueue) {
		c.misrouted++ // one broker: the queue id is the index
	}
	k := group + "\x00" + key
	if last, ok := c.last[k]; ok && ev.Delivery.QueueOffset < last {
		c.behind++
	}
	c.last[k] = ev.Delivery.QueueOffset
}

// runOrdering measures the consumer with and without ordering, and Send
// with and without a routing key.
func runOrdering(ctx context.Context, e *Env) *Workload {
	o := e.Opt
	n := o.Messages
	drainCPU = newCPUMeter(e.S.DBAddr(), e.S.Broker)
	w := &Workload{Name: "ordering", Params: map[string]string{
		"goroutines": fmt.Sprint(o.Concurrency), "messages": fmt.Sprint(n), "payload": fmt.Sprint(o.Payload),
		"rounds": fmt.Sprint(o.Rounds), "queues": fmt.Sprint(orderingQueue), "few_aggregates": fmt.Sprint(orderingFew),
		"send_round": roundDesc(o),
	}}
	fail := func(err error) *Workload { w.Error = err.Error(); return w }
	desc := "rmqtx consumer (BatchSize 1, VersionNone), first delivery: BEGIN; dedup INSERT; business INSERT; COMMIT; "
	consumerSides := []*Side{
		{Name: sideOrdNone, Unit: "msgs/s", Description: desc + "events without aggregate or business key: the consumer orders nothing (as before ordering)"},
		{Name: sideOrdEach, Unit: "msgs/s", Description: desc + "every event its own aggregate: the order is kept, no event ever waits"},
		{Name: sideOrdFew, Unit: "msgs/s", Description: desc + fmt.Sprintf("%d aggregates (4 per queue on average): an event waits for the one before it of its aggregate", orderingFew)},
		{Name: sideOrdOne, Unit: "msgs/s", Description: desc + "one aggregate: every event on one queue, applied one at a time"},
	}
	w.Sides = append(w.Sides, consumerSides...)

	topics, tables := map[string]string{}, map[string]string{}
	prefix := e.Names.Name("o") + "_"
	for i, s := range consumerSides {
		topics[s.Name], tables[s.Name] = e.Names.Name(fmt.Sprintf("otopic%d", i)), e.Names.Name(fmt.Sprintf("orders_ord%d", i))
		if err := e.CreateTopic(ctx, topics[s.Name], orderingQueue); err != nil {
			return fail(err)
		}
		if err := e.businessTable(ctx, tables[s.Name]); err != nil {
			return fail(err)
		}
	}
	if err := schema.MigrateAll(ctx, e.DB, prefix); err != nil {
		return fail(fmt.Errorf("ordering migrate: %w", err))
	}

	// Preload: N events per side, each aggregate's versions ascending, on
	// the queue txproducer would choose.
	g := e.Names.Name("opre")
	p, err := rmq.NewProducer(producer.WithNsResolver(e.S.Resolver()), producer.WithGroupName(g),
		producer.WithInstanceName(g+"-"+randHex(6)), producer.WithRetry(2), producer.WithQueueSelector(rmqroute.New()))
	if err != nil {
		return fail(fmt.Errorf("preload producer: %w", err))
	}
	if err := p.Start(); err != nil {
		return fail(fmt.Errorf("preload producer start: %w", err))
	}
	t0 := time.Now()
	for _, s := range consumerSides {
		msgs := make([]*primitive.Message, n)
		versions := map[string]int64{}
		for i := range msgs {
			agg := orderKeys(s.Name, e.Names.Run(), i)
			versions[agg]++
			msgs[i] = orderedMessage(topics[s.Name], s.Name, e.Names.Run(), i, versions[agg], makePayload(o.Payload, int64(i)))
		}
		if err := e.preload(ctx, p, msgs); err != nil {
			_ = p.Shutdown()
			return fail(err)
		}
	}
	_ = p.Shutdown()
	e.Log("  preloaded %d messages into %d topics in %s", n, len(consumerSides), time.Since(t0).Round(time.Millisecond))

	check := &orderCheck{last: map[string]int64{}}
	start := func(side, group string) func() (*drain, error) {
		insert := e.insertOrderSQL(tables[side])
		return func() (*drain, error) {
			c, err := consumer.New(consumer.Config{
				Group: group, DB: e.DB, TablePrefix: prefix,
				Routes: map[string]consumer.Route{benchEventType: {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
					if _, err := tx.ExecContext(ctx, insert, ev.ID, int64(len(ev.Payload)), ev.Payload); err != nil {
						return err
					}
					check.apply(group, ev)
					return nil
				}}},
				VersionMode: consumer.VersionNone,
				NameServers: []string{e.S.NameServer},
				Topic:       topics[side],
				Goroutines:  o.Concurrency,
				BatchSize:   1,
			})
			if err != nil {
				return nil, err
			}
			if err := c.Start(ctx); err != nil {
				_ = c.Close()
				return nil, err
			}
			stop := func() {
				sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = c.Shutdown(sctx)
			}
			return &drain{count: func() int64 { return c.Processor().Stats().Applied }, stop: stop}, nil
		}
	}
	if o.Warmup > 0 {
		if _, err := measureDrain(ctx, e, 0, int64(n), start(sideOrdNone, e.Names.Name("owarm"))); err != nil {
			return fail(fmt.Errorf("warm-up: %w", err))
		}
		e.Log("  warm-up done")
	}
	names := make([]string, len(consumerSides))
	byName := map[string]*Side{}
	for i, s := range consumerSides {
		names[i], byName[s.Name] = s.Name, s
	}
	for r := 0; r < o.Rounds && ctx.Err() == nil; r++ {
		for _, name := range rotate(names, r) {
			ro, err := measureDrain(ctx, e, r+1, int64(n), start(name, e.Names.Name("ogrp")))
			if err != nil {
				return fail(fmt.Errorf("round %d %s: %w", r+1, name, err))
			}
			byName[name].Rounds = append(byName[name].Rounds, ro)
			e.Log("  round %d %-38s %8.1f msgs/s (%.2fs, start-up %.2fs, cpu/msg: bench %.0fus)", r+1, name, ro.Rate, ro.Seconds,
				ro.Extra["startup_seconds"], ro.Extra["bench_cpu_us_per_msg"])
		}
	}
	for _, s := range consumerSides {
		want := int64(len(s.Rounds)) * int64(n)
		if s.Name == sideOrdNone && o.Warmup > 0 {
			want += int64(n)
		}
		if rows, err := e.countRows(ctx, tables[s.Name]); err == nil && int64(rows) != want {
			w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %s: %d business rows for %d (group, event) pairs", s.Name, rows, want))
		}
	}
	check.mu.Lock()
	behind, misrouted := check.behind, check.misrouted
	check.mu.Unlock()
	if behind != 0 || misrouted != 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %d events applied behind a later event of their aggregate, %d off their aggregate's queue", behind, misrouted))
	} else {
		e.Log("  check: every aggregate's events applied in queue order, each aggregate on wire.QueueFor's queue")
	}

	// Send with and without a routing key.
	var sides []*loopSide
	defer func() {
		for _, s := range sides {
			s.close()
		}
	}()
	for _, name := range []string{sideSendNone, sideSendEach, sideSendOne} {
		s, err := routedSendSide(ctx, e, name)
		if err != nil {
			return fail(err)
		}
		sides = append(sides, s)
		w.Sides = append(w.Sides, s.side)
	}
	measureLoops(ctx, e, w, sides)

	w.Notes = append(w.Notes,
		"consumer sides: one rmqtx consumer configuration, four preloaded topics that differ only in the events' aggregates; the consumer keeps the order per routing key and orders nothing for events without one, so the no-key side is the consumer without ordering",
		fmt.Sprintf("rate = messages applied from the first to the last one; %d queues per topic, %d consumer goroutines, fresh group per round", orderingQueue, o.Concurrency),
		"checked: every aggregate's events applied in queue-offset order, and every aggregate on the queue wire.QueueFor names",
		"Send sides: txproducer.Send as the producer workload's rmqtx Send, with no aggregate, a new aggregate per Send, or one aggregate for every Send (all on one queue); each side has its own topic (4 queues), group and business table")
	return w
}

// routedSendSide is txproducer.Send with the business INSERT, the event's
// aggregate chosen by side (orderKeys).
func routedSendSide(ctx context.Context, e *Env, side string) (*loopSide, error) {
	kind := map[string]string{sideSendNone: "osn", sideSendEach: "ose", sideSendOne: "oso"}[side]
	topic, group, table := e.Names.Name(kind), e.Names.Name(kind+"g"), e.Names.Name("orders_"+kind)
	if err := e.CreateTopic(ctx, topic, orderingQueue); err != nil {
		return nil, err
	}
	if err := e.businessTable(ctx, table); err != nil {
		return nil, err
	}
	store, err := newTxlog(ctx, e)
	if err != nil {
		return nil, err
	}
	var checks, recoveries atomic.Int64
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{e.S.NameServer}, Group: group, DB: e.DB, Log: store, WarmupTopics: []string{topic},
		DisablePayloadStorage: e.Opt.NoPayload,
		OnCheck:               func(checkback.Answer) { checks.Add(1) },
		OnRecovery:            func(discard.Result) { recoveries.Add(1) },
	})
	if err != nil {
		return nil, err
	}
	if err := p.Start(ctx); err != nil {
		return nil, fmt.Errorf("txproducer start: %w", err)
	}
	desc := map[string]string{
		sideSendNone: "txproducer.Send, no aggregate and no business key: any queue",
		sideSendEach: "txproducer.Send, a new aggregate per Send (Order/<n>, version 1): the queue wire.QueueFor picks",
		sideSendOne:  "txproducer.Send, one aggregate for every Send (versions 1, 2, ...): every Send on one queue",
	}[side]
	s := &loopSide{
		side: &Side{Name: side, Unit: "tx/s", Description: desc},
		close: func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = p.Shutdown(sctx)
		},
		table: table,
		probe: &roundProbe{db: e.DB.DB, checks: checks.Load, recoveries: recoveries.Load},
	}
	insert := e.insertOrderSQL(table)
	payloadSize := e.Opt.Payload
	var sends atomic.Int64 // RunLoop's seq restarts every round; aggregates and versions must not
	s.op = s.counted(func(ctx context.Context, _ int, seq int64) error {
		i := sends.Add(1)
		payload := makePayload(payloadSize, seq)
		msg := txproducer.Message{Topic: topic, Tags: benchEventType, EventType: benchEventType, Payload: payload}
		if agg := orderKeys(side, e.Names.Run(), int(i)); agg != "" {
			msg.AggregateType, msg.AggregateID, msg.AggregateVersion = "Order", agg, 1
			if side == sideSendOne {
				msg.AggregateVersion = i
			}
		}
		id := wire.NewEventID()
		res, err := p.Send(ctx, msg, func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, insert, id, int64(len(payload)), payload)
			return err
		})
		if err != nil {
			return err
		}
		if res.State != txproducer.StateCommitted {
			return fmt.Errorf("send state %s", res.State)
		}
		return nil
	})
	return s, nil
}
