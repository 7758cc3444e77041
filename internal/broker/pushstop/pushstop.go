// Package pushstop shuts a rocketmq-client-go push consumer down without
// reaching the upstream client's "send on closed channel" panic
// (apache/rocketmq-client-go#1051), from outside the client.
//
// The client's Shutdown closes each process queue's message channel while a
// pull goroutine may still be handing a pull result to that queue
// (processQueue.putMessage). The send sits in a select with the queue's close
// channel, which Shutdown closes too, so the select may pick the send: a
// panic in a goroutine the client starts without a recover, which ends the
// process. Suspend alone does not prevent it: it only stops the pull loop
// from issuing new pulls; a long-polling pull already in flight still
// returns messages and puts them, up to 20 s later.
//
// A Gate closes that window in three steps, each on the client's public
// surface:
//
//  1. Suspend: no new pulls.
//  2. Close the gate: a filter hook (consumer.WithFilterMessageHook), which
//     the client runs on every pull result before putMessage, returns no
//     message from now on, so the pulls still in flight put nothing. Their
//     messages were never cached nor acknowledged: the queue's next owner
//     pulls them again from the committed offset.
//  3. Wait, bounded by ctx, until every batch the hook let through before
//     has been handed over (proved by its delivery to the wrapped callback,
//     by its queue no longer being the consumer's, or by a committed offset
//     past it), no callback runs, the client's queues cache no message, and
//     each queue's offset is past every message whose callback returned:
//     every outcome (acknowledged, or handed back to the broker) is in the
//     client's offset table, which Shutdown then persists. The client
//     removes a message from its cache and moves the offset in two steps,
//     so an empty cache alone would let Shutdown persist an older offset.
//
// Then it writes those offsets to their brokers itself, one request each,
// each confirmed by the broker's answer. The client persists them at
// Shutdown with one-way requests just before it closes its connections, and
// measured on the upstream client some of those never take effect: the
// broker kept an older offset, so messages already applied would be
// delivered again.
//
// Only then does Shutdown run; no putMessage can be in progress. The same
// steps make the patched client (third_party/rocketmq-client-go, patch 3)
// lose no acknowledgement at shutdown either.
//
// After the client's Shutdown, Gate.Shutdown writes the same offsets once
// more, and that write is the one that counts. Every pull request carries
// the offset the client held when it built the request, and the broker
// stores it as the group's offset, even when it is lower than the stored
// one (it only logs "[NOTIFYME]update consumer offset less than store").
// A pull built before the last outcome was recorded (the pull goroutine
// passed its suspend check before Stop, or the broker's pull threads were
// slow to take it) can reach the broker after Stop's write and move the
// offset back; the client's one-way persist at Shutdown repairs that only
// when it lands after the pull and is not lost with the closing connection.
// Once the client is shut down it sends nothing more, so the final write
// comes after every request of the client's that the broker answers in
// turn.
//
// A queue taken away by a rebalance and given back just before Stop, before
// its first new pull, holds the offset the client read from the broker,
// which may lie below the outcomes this consumer recorded in its earlier
// tenure; being suspended, the client pulls nothing that would move it.
// When that is all Stop still waits for (nothing running, cached or on its
// way) for reacquiredAfter, Stop stops waiting for those queues and counts
// them (Reacquired): their messages above that offset are delivered again
// to the queue's next owner (duplicates, never a loss).
//
// Limits: the wait ends with ctx. Shutdown then shuts the client down anyway
// and returns ctx's error, so a context too short for the handlers in flight
// gives up the guarantee. The client's queue table is read through reflection on an exported
// method (see queueTable); if its shape changes, Stop proves deliveries only.
//
// Use one Gate per push consumer, for concurrent (not orderly) consumption:
//
//	g := pushstop.New(group, nameServers)
//	pc, err := rocketmq.NewPushConsumer(append(opts, g.Option())...)
//	err = pc.Subscribe(topic, selector, g.Wrap(callback))
//	...
//	err = g.Shutdown(ctx, pc) // instead of pc.Shutdown()
package pushstop

import (
	"context"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/hooks"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// ConsumeFunc is a push consumer's subscription callback.
type ConsumeFunc = func(context.Context, ...*primitive.MessageExt) (consumer.ConsumeResult, error)

// pollEvery is how often Stop re-reads the client's state while it waits.
const pollEvery = 5 * time.Millisecond

// reacquiredAfter is how long Stop waits on queues whose offset lags their
// recorded outcomes while nothing else is outstanding before it takes them
// for queues given back by a rebalance (see the package doc). The client
// moves a queue's offset right after it empties the queue's cache, so a lag
// that outlasts it with nothing cached has no outcome left to record.
const reacquiredAfter = time.Second

// reqUpdateConsumerOffset is the broker's UPDATE_CONSUMER_OFFSET request.
const reqUpdateConsumerOffset = 15

// Gate guards one push consumer's shutdown. The zero value is not usable:
// create it with New.
type Gate struct {
	group       string
	nameServers []string

	mu     sync.Mutex
	closed bool
	// pending holds, per queue, the last pull result the hook let through
	// and nobody has seen delivered yet. A queue's pull goroutine runs the
	// hook and putMessage in turn, so a newer batch for a queue means the
	// older one was put; only the newest can still be on its way.
	pending map[primitive.MessageQueue]batch
	// returned holds, per queue, the highest offset among messages whose
	// callback has returned. The client records the outcome (removes the
	// message from its cache, then moves the queue's offset) just after
	// the callback returns, in two steps: an empty cache alone does not
	// prove that the offset has moved.
	returned  map[primitive.MessageQueue]int64
	running   int   // wrapped callbacks in progress
	discarded int64 // messages of pull results dropped after the gate closed
	// reacquired counts the queues Stop stopped waiting for as given back
	// by a rebalance (see the package doc).
	reacquired int64
	// settled is the queue table Stop found settled (nil before): the
	// offsets Shutdown writes again once the client is shut down.
	settled map[primitive.MessageQueue]queueInfo
	// afterClientShutdown, when set (tests only), runs between the client's
	// Shutdown and the final write of the offsets.
	afterClientShutdown func()
}

type batch struct {
	msgs []*primitive.MessageExt
	last int64 // highest queue offset in msgs
}

// New returns an open gate for a push consumer of group that uses
// nameServers; Stop writes the group's offsets through them. With no name
// server, Stop leaves the offsets to the client's Shutdown.
func New(group string, nameServers []string) *Gate {
	return &Gate{
		group:       group,
		nameServers: nameServers,
		pending:     map[primitive.MessageQueue]batch{},
		returned:    map[primitive.MessageQueue]int64{},
	}
}

// Option installs the gate's filter hook. consumer.WithFilterMessageHook
// replaces the hook list, so pass Option after any other such option, or
// use Hook in your own list.
func (g *Gate) Option() consumer.Option {
	return consumer.WithFilterMessageHook([]hooks.FilterMessageHook{g.Hook})
}

// Hook is the filter hook: it lets pull results through and remembers them
// until they are delivered, and once the gate is closed it drops them.
func (g *Gate) Hook(fc *hooks.FilterMessageContext) ([]*primitive.MessageExt, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		g.discarded += int64(len(fc.Msg))
		return nil, nil
	}
	if len(fc.Msg) > 0 && fc.MQ != nil {
		b := batch{msgs: fc.Msg, last: -1}
		first := fc.Msg[0].QueueOffset
		for _, m := range fc.Msg {
			b.last = max(b.last, m.QueueOffset)
			first = min(first, m.QueueOffset)
		}
		g.pending[*fc.MQ] = b
		// The queue is read again from below what was consumed (a queue
		// given back after a rebalance): those outcomes no longer decide
		// its offset, these messages' do.
		if r, ok := g.returned[*fc.MQ]; ok && first <= r {
			delete(g.returned, *fc.MQ)
		}
	}
	return fc.Msg, nil
}

// Wrap wraps a subscription callback: a delivery proves that its batch has
// left putMessage, and the gate counts callbacks in progress.
func (g *Gate) Wrap(f ConsumeFunc) ConsumeFunc {
	return func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		g.enter(msgs)
		defer g.leave(msgs)
		return f(ctx, msgs...)
	}
}

func (g *Gate) enter(msgs []*primitive.MessageExt) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running++
	// A callback gets part of one pull result, so one message identifies it.
	if len(msgs) == 0 || msgs[0].Queue == nil {
		return
	}
	mq := *msgs[0].Queue
	if b, ok := g.pending[mq]; ok {
		for _, m := range b.msgs {
			if m == msgs[0] {
				delete(g.pending, mq)
				return
			}
		}
	}
}

func (g *Gate) leave(msgs []*primitive.MessageExt) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.running--
	if len(msgs) == 0 || msgs[0].Queue == nil {
		return
	}
	mq := *msgs[0].Queue
	hi, ok := g.returned[mq]
	if !ok {
		hi = -1
	}
	for _, m := range msgs {
		hi = max(hi, m.QueueOffset)
	}
	g.returned[mq] = hi
}

// Discarded returns how many messages of pull results the closed gate has
// dropped (they are redelivered to the queue's next owner).
func (g *Gate) Discarded() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.discarded
}

// Reacquired returns how many queues Stop stopped waiting for as given
// back by a rebalance just before it (see the package doc): their messages
// above the offset the client held are delivered again.
func (g *Gate) Reacquired() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reacquired
}

// Shutdown is Stop, then pc.Shutdown, then the offsets Stop wrote are
// written again: a pull the client built before Stop can carry an older
// offset to the broker after Stop's write (see the package doc), and after
// its Shutdown the client sends nothing more. pc is shut down even when ctx
// ends first; the error then wraps ctx's.
func (g *Gate) Shutdown(ctx context.Context, pc rocketmq.PushConsumer) error {
	serr := g.Stop(ctx, pc)
	if err := pc.Shutdown(); err != nil {
		return fmt.Errorf("pushstop: shutdown: %w", err)
	}
	if serr != nil {
		return serr
	}
	if g.afterClientShutdown != nil {
		g.afterClientShutdown()
	}
	g.mu.Lock()
	qs := g.settled
	g.mu.Unlock()
	return g.commit(ctx, qs)
}

// Stop suspends pc, closes the gate and waits, bounded by ctx, until no
// pull result is on its way into a queue, no callback runs, the queues
// cache nothing and their offsets cover every outcome; then it writes those
// offsets to the brokers. It does not shut pc down. On ctx's end it returns an error
// that wraps ctx.Err() and says what was still outstanding.
func (g *Gate) Stop(ctx context.Context, pc rocketmq.PushConsumer) error {
	// Suspend before closing the gate: a pull issued between the two would
	// otherwise have its result dropped and the next pull, if it found no
	// new message, would commit the queue's offset past the dropped ones.
	pc.Suspend()
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	var lagSince time.Time // since when only lagging offsets are outstanding
	for {
		s, qs := g.state(pc)
		switch {
		case !s.onlyLagging():
			lagSince = time.Time{}
		case lagSince.IsZero():
			lagSince = time.Now()
		case time.Since(lagSince) >= reacquiredAfter:
			g.mu.Lock()
			g.reacquired += int64(len(g.returned))
			clear(g.returned)
			g.mu.Unlock()
			continue
		}
		if s.settled() {
			g.mu.Lock()
			g.settled = qs
			g.mu.Unlock()
			return g.commit(ctx, qs)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pushstop: stop: %s: %w", s, ctx.Err())
		case <-t.C:
		}
	}
}

// commit writes the offsets of the queues pc holds to their brokers and
// waits for each broker's answer.
func (g *Gate) commit(ctx context.Context, qs map[primitive.MessageQueue]queueInfo) error {
	if len(g.nameServers) == 0 {
		return nil
	}
	masters := map[string]map[string]string{} // topic -> broker name -> master address
	for mq, q := range qs {
		if q.dropped || q.committed < 0 {
			continue
		}
		addrs, ok := masters[mq.Topic]
		if !ok {
			route, err := remoting.TopicRoute(ctx, g.nameServers, 0, mq.Topic)
			if err != nil {
				return fmt.Errorf("pushstop: commit offsets: %w", err)
			}
			addrs = make(map[string]string, len(route))
			for _, b := range route {
				addrs[b.Name] = b.Addr
			}
			masters[mq.Topic] = addrs
		}
		addr := addrs[mq.BrokerName]
		if addr == "" {
			return fmt.Errorf("pushstop: commit offsets: no master for broker %s of %s", mq.BrokerName, mq.Topic)
		}
		h, _, err := remoting.RoundTrip(ctx, addr, 0, reqUpdateConsumerOffset, map[string]string{
			"consumerGroup": g.group,
			"topic":         mq.Topic,
			"queueId":       strconv.Itoa(mq.QueueId),
			"commitOffset":  strconv.FormatInt(q.committed, 10),
			"bname":         mq.BrokerName,
		})
		if err != nil {
			return fmt.Errorf("pushstop: commit offsets: %w", err)
		}
		if h.Code != remoting.ResSuccess {
			return fmt.Errorf("pushstop: commit offset of %s queue %d on %s: code %d: %s", mq.Topic, mq.QueueId, addr, h.Code, h.Remark)
		}
	}
	return nil
}

// outstanding is what Stop still waits for.
type outstanding struct {
	batches, running, cached, unrecorded int
	known                                bool // the client's queue table could be read
}

func (o outstanding) settled() bool {
	return o.batches == 0 && o.running == 0 && o.cached == 0 && o.unrecorded == 0
}

// onlyLagging: all Stop waits for is queues whose offset lags their
// recorded outcomes (the queue table could be read).
func (o outstanding) onlyLagging() bool {
	return o.known && o.unrecorded > 0 && o.batches == 0 && o.running == 0 && o.cached == 0
}

func (o outstanding) String() string {
	s := fmt.Sprintf("%d pull results not yet handed over, %d callbacks running, %d messages cached, %d queues whose offset lags their consumed messages",
		o.batches, o.running, o.cached, o.unrecorded)
	if !o.known {
		s += " (queue table unreadable)"
	}
	return s
}

func (g *Gate) state(pc rocketmq.PushConsumer) (outstanding, map[primitive.MessageQueue]queueInfo) {
	g.mu.Lock()
	running := g.running
	g.mu.Unlock()
	qs, known := queueTable(pc)
	o := outstanding{running: running, known: known}
	g.mu.Lock()
	for mq, b := range g.pending {
		q, held := qs[mq]
		// Proofs besides delivery: the queue is no longer the consumer's
		// (Shutdown does not touch a queue it no longer holds), or every
		// message of the batch has been acknowledged, which a batch still on
		// its way into this queue cannot be.
		if known && (!held || q.dropped || q.committed > b.last) {
			delete(g.pending, mq)
		}
	}
	o.batches = len(g.pending)
	// Every outcome recorded: the queue's offset is past the highest
	// message whose callback returned (or the queue is no longer held).
	for mq, hi := range g.returned {
		q, held := qs[mq]
		if known && (!held || q.dropped || q.committed > hi) {
			delete(g.returned, mq)
		}
	}
	if known {
		o.unrecorded = len(g.returned)
	}
	g.mu.Unlock()
	for _, q := range qs {
		if !q.dropped {
			o.cached += q.cached
		}
	}
	return o, qs
}

type queueInfo struct {
	cached    int
	dropped   bool
	committed int64
}

// queueTable reads the consumer's queues through the client's exported
// GetConsumerRunningInfo (the method the broker's admin calls use). Its
// result type lives in the client's internal package, so it is read by
// reflection, field names only. ok is false when the client has no such
// method or its shape changed; Stop then relies on deliveries alone.
func queueTable(pc any) (map[primitive.MessageQueue]queueInfo, bool) {
	m := reflect.ValueOf(pc).MethodByName("GetConsumerRunningInfo")
	if !m.IsValid() || m.Type().NumIn() != 1 || m.Type().In(0).Kind() != reflect.Bool || m.Type().NumOut() != 1 {
		return nil, false
	}
	info := m.Call([]reflect.Value{reflect.ValueOf(false)})[0]
	if info.Kind() == reflect.Pointer {
		if info.IsNil() {
			return nil, false
		}
		info = info.Elem()
	}
	if info.Kind() != reflect.Struct {
		return nil, false
	}
	tbl := info.FieldByName("MQTable")
	if tbl.Kind() != reflect.Map || tbl.Type().Key() != reflect.TypeFor[primitive.MessageQueue]() || tbl.Type().Elem().Kind() != reflect.Struct {
		return nil, false
	}
	cached, dropped, committed := field(tbl.Type().Elem(), "CachedMsgCount", reflect.Int), field(tbl.Type().Elem(), "Dropped", reflect.Bool), field(tbl.Type().Elem(), "CommitOffset", reflect.Int64)
	if cached < 0 || dropped < 0 || committed < 0 {
		return nil, false
	}
	out := make(map[primitive.MessageQueue]queueInfo, tbl.Len())
	it := tbl.MapRange()
	for it.Next() {
		v := it.Value()
		out[it.Key().Interface().(primitive.MessageQueue)] = queueInfo{
			cached:    int(v.Field(cached).Int()),
			dropped:   v.Field(dropped).Bool(),
			committed: v.Field(committed).Int(),
		}
	}
	return out, true
}

// field returns the index of the exported field name of kind k in t, or -1.
func field(t reflect.Type, name string, k reflect.Kind) int {
	f, ok := t.FieldByName(name)
	if !ok || !f.IsExported() || f.Type.Kind() != k || len(f.Index) != 1 {
		return -1
	}
	return f.Index[0]
}
