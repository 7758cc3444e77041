package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
)

// claimHistogram reads the outbox claim-latency histogram: how many claim
// transactions ran and their total seconds.
func claimHistogram(g prometheus.Gatherer) (uint64, float64, bool) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, 0, false
	}
	for _, mf := range mfs {
		if mf.GetName() != "rmqtx_outbox_claim_latency_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum(), true
		}
	}
	return 0, 0, false
}

// runOutbox compares the outbox dispatcher with sending the same messages
// with SendSync at the same concurrency: N rows preloaded PENDING, time until
// all are SENT, with 1 and with 2 dispatchers (the concurrency split between
// them, so the total number of sends in flight is the same on every side).
func runOutbox(ctx context.Context, e *Env) *Workload {
	o := e.Opt
	n := o.OutboxRows
	w := &Workload{Name: "outbox", Params: map[string]string{
		"concurrency": fmt.Sprint(o.Concurrency), "messages": fmt.Sprint(n), "payload": fmt.Sprint(o.Payload),
		"rounds": fmt.Sprint(o.Rounds), "batch": "64 (default)",
	}}
	raw := &Side{Name: sideOutboxRaw, Unit: "msgs/s", Description: "rocketmq-client-go SendSync of the same messages (outbox.RocketMQMessage), no database"}
	one := &Side{Name: sideOutboxOne, Unit: "msgs/s", Description: fmt.Sprintf("one Dispatcher, Concurrency %d, RocketMQSink with batch sends: held claim (SELECT ... FOR UPDATE SKIP LOCKED, transaction left open) -> one RocketMQ batch per target queue -> SENT written and committed in the claim's transaction (one write per row)", o.Concurrency)}
	two := &Side{Name: sideOutboxTwo, Unit: "msgs/s", Description: fmt.Sprintf("two Dispatchers on one table, Concurrency %d each, one RocketMQSink each", max(1, o.Concurrency/2))}
	w.Sides = []*Side{raw, one, two}
	fail := func(err error) *Workload { w.Error = err.Error(); return w }

	topic := e.Names.Name("otopic")
	if err := e.CreateTopic(ctx, topic, 4); err != nil {
		return fail(err)
	}
	rawP, err := e.newRawProducer(e.Names.Name("oraw"), 0)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = rawP.Shutdown() }()
	var sinks []*outbox.RocketMQSink
	defer func() {
		for _, s := range sinks {
			_ = s.Close()
		}
	}()
	for i := 0; i < 2; i++ {
		s, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{e.S.NameServer}, Group: e.Names.Name("osink")})
		if err != nil {
			return fail(err)
		}
		sinks = append(sinks, s)
	}

	var seq atomic.Int64
	events := func(k int) []outbox.Event {
		evs := make([]outbox.Event, k)
		for i := range evs {
			s := seq.Add(1)
			evs[i] = outbox.Event{
				EventID:     fmt.Sprintf("%s-o%07d", e.Names.Run(), s),
				EventType:   benchEventType,
				Destination: topic,
				Payload:     makePayload(o.Payload, s),
			}
		}
		return evs
	}

	sides := map[string]func(index, k int) (Round, error){
		sideOutboxRaw: func(index, k int) (Round, error) { return outboxRaw(ctx, e, rawP, index, events(k)) },
		sideOutboxOne: func(index, k int) (Round, error) {
			return outboxDispatch(ctx, e, index, events(k), []outbox.Sink{sinks[0]}, o.Concurrency)
		},
		sideOutboxTwo: func(index, k int) (Round, error) {
			return outboxDispatch(ctx, e, index, events(k), []outbox.Sink{sinks[0], sinks[1]}, max(1, o.Concurrency/2))
		},
	}
	order := []string{sideOutboxRaw, sideOutboxOne, sideOutboxTwo}
	bySide := map[string]*Side{sideOutboxRaw: raw, sideOutboxOne: one, sideOutboxTwo: two}
	if o.Warmup > 0 {
		for _, name := range order {
			if _, err := sides[name](0, max(100, n/4)); err != nil {
				return fail(fmt.Errorf("warm-up %s: %w", name, err))
			}
		}
		e.Log("  warm-up done")
	}
	for r := 0; r < o.Rounds && ctx.Err() == nil; r++ {
		for _, name := range rotate(order, r) {
			ro, err := sides[name](r+1, n)
			if err != nil {
				return fail(fmt.Errorf("round %d %s: %w", r+1, name, err))
			}
			bySide[name].Rounds = append(bySide[name].Rounds, ro)
			e.Log("  round %d %-32s %8.1f msgs/s (%.2fs) %s", r+1, name, ro.Rate, ro.Seconds, claimLine(ro))
		}
	}
	w.Notes = append(w.Notes,
		"rows are preloaded PENDING into a fresh table per round (not timed); a dispatcher round runs from Start to the last SENT outcome; the raw round from the first SendSync to the last",
		"the dispatcher claims ahead: while its senders are busy a claim waits for BatchSize/2 free buffer places, and SENT is written once per claim (see the claims/rows-per-claim figures)",
		"claim loop busy = the claim histogram's seconds / the round's seconds, per dispatcher: with a BatchSink a claim is the locking SELECT of a held claim (the SENT UPDATE and the COMMIT run on the sender that finishes the claim's last batch); before issue 25 it also wrote every row SENDING and committed",
		"the RocketMQSink sends each claim's rows as RocketMQ batches, one per target queue (outbox.BatchSink); the raw side sends each message with its own SendSync, as the issue's baseline says")
	return w
}

// outboxRaw sends the events' messages with SendSync on Concurrency
// goroutines and times the whole batch.
func outboxRaw(ctx context.Context, e *Env, p rmq.Producer, index int, evs []outbox.Event) (Round, error) {
	msgs := make([]*primitive.Message, len(evs))
	for i := range evs {
		msgs[i] = outbox.RocketMQMessage(&outbox.Message{Event: evs[i], Attempt: 1})
	}
	t0 := time.Now()
	if err := e.preload(ctx, p, msgs); err != nil {
		return Round{}, err
	}
	el := time.Since(t0)
	return Round{Index: index, Count: int64(len(evs)), Seconds: el.Seconds(), Rate: float64(len(evs)) / el.Seconds()}, nil
}

// outboxDispatch preloads evs into a fresh outbox table, then starts one
// dispatcher per sink and times until every row is SENT.
func outboxDispatch(ctx context.Context, e *Env, index int, evs []outbox.Event, sinks []outbox.Sink, conc int) (Round, error) {
	prefix := e.Names.Name("ob") + "_"
	table, err := outbox.NewTable(prefix)
	if err != nil {
		return Round{}, err
	}
	if err := schema.MigrateAll(ctx, e.DB, prefix); err != nil {
		return Round{}, fmt.Errorf("outbox migrate: %w", err)
	}
	if err := enqueueAll(ctx, e.DB, table, evs); err != nil {
		return Round{}, err
	}

	var (
		sent, other atomic.Int64
		done        = make(chan struct{})
		doneOnce    sync.Once
		want        = int64(len(evs))
		firstErr    atomic.Value
	)
	onOutcome := func(oc outbox.Outcome) {
		if oc.Status == outbox.StatusSent {
			if sent.Add(1) == want {
				doneOnce.Do(func() { close(done) })
			}
			return
		}
		other.Add(1)
		if oc.Err != nil {
			firstErr.CompareAndSwap(nil, oc.Err.Error())
		}
	}
	// Metrics as a production deployment would have them; the claim
	// histogram tells how many claim transactions the round took.
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		return Round{}, err
	}
	var ds []*outbox.Dispatcher
	for _, s := range sinks {
		d, err := outbox.NewDispatcher(outbox.Config{
			DB: e.DB, TablePrefix: prefix, Sink: s, Concurrency: conc,
			Name: fmt.Sprintf("bench-%d-%s", len(ds), randHex(4)), OnOutcome: onOutcome, Observe: observe.Observe{Metrics: m},
		})
		if err != nil {
			return Round{}, err
		}
		ds = append(ds, d)
	}
	defer func() {
		for _, d := range ds {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_ = d.Shutdown(sctx)
			cancel()
		}
	}()
	t0 := time.Now()
	for _, d := range ds {
		if err := d.Start(ctx); err != nil {
			return Round{}, err
		}
	}
	timer := time.NewTimer(e.Opt.Timeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		return Round{}, fmt.Errorf("%d of %d rows SENT after %s (%d other outcomes, first error %v)", sent.Load(), want, e.Opt.Timeout, other.Load(), firstErr.Load())
	case <-ctx.Done():
		return Round{}, ctx.Err()
	}
	el := time.Since(t0)
	r := Round{Index: index, Count: want, Seconds: el.Seconds(), Rate: float64(want) / el.Seconds()}
	if other.Load() > 0 {
		r.Errors = other.Load()
	}
	if claims, sum, ok := claimHistogram(reg); ok && claims > 0 {
		r.Extra = map[string]float64{
			"claims":           float64(claims),
			"rows_per_claim":   float64(want) / float64(claims),
			"mean_claim_ms":    sum * 1000 / float64(claims),
			"claim_loop_busy":  sum / el.Seconds() / float64(len(ds)),
			"dispatchers":      float64(len(ds)),
			"concurrency_each": float64(conc),
		}
	}
	counts, err := table.CountByStatus(ctx, e.DB)
	if err != nil {
		return Round{}, err
	}
	if int64(counts[outbox.StatusSent]) != want {
		return Round{}, fmt.Errorf("CHECK FAILED: %d rows SENT in the table, want %d (%v)", counts[outbox.StatusSent], want, counts)
	}
	return r, nil
}

func claimLine(r Round) string {
	if r.Extra == nil {
		return ""
	}
	return fmt.Sprintf("claims %.0f, %.2f rows/claim, %.2fms/claim, claim loop busy %.0f%%",
		r.Extra["claims"], r.Extra["rows_per_claim"], r.Extra["mean_claim_ms"], 100*r.Extra["claim_loop_busy"])
}

// enqueueAll writes evs into table, 200 rows per transaction: the outbox
// rows a round's dispatcher then drains.
func enqueueAll(ctx context.Context, db *sqlx.DB, table outbox.Table, evs []outbox.Event) error {
	const batch = 200
	for i := 0; i < len(evs); i += batch {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		for _, ev := range evs[i:min(i+batch, len(evs))] {
			if _, err := table.Enqueue(ctx, tx, ev); err != nil {
				_ = tx.Rollback()
				return fmt.Errorf("enqueue: %w", err)
			}
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}
