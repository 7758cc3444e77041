package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// orphanListener is the first instance: for the ids in commit it writes a
// COMMITTED txlog row in its local transaction (the row the real producer
// would write), and it answers UNKNOWN to everything, like an instance that
// crashed between the local commit and END_TRANSACTION, or before its local
// transaction ran.
type orphanListener struct {
	store  *txlog.Store
	group  string
	commit map[string]bool
	mu     sync.Mutex
	err    error
}

func (l *orphanListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	id := m.GetProperty(wire.PropEventID)
	if !l.commit[id] {
		return primitive.UnkonwnState
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := l.store.Insert(ctx, l.store.DB(), txlog.Row{
		EventID: id, ProducerGroup: l.group, Topic: m.Topic, Tags: m.GetTags(), Keys: m.GetKeys(),
		EventType: m.GetProperty(wire.PropEventType), State: txlog.StateCommitted,
		Payload: m.Body, PayloadHash: m.GetProperty(wire.PropPayloadHash), ResolvedBy: txlog.ByLocalCommit,
	})
	if err != nil {
		l.mu.Lock()
		if l.err == nil {
			l.err = err
		}
		l.mu.Unlock()
	}
	return primitive.UnkonwnState
}

func (l *orphanListener) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	return primitive.UnkonwnState
}

func brokerTxTimeout() time.Duration {
	if ms, err := strconv.Atoi(getenv("RMQTX_TX_TIMEOUT_MS", "3000")); err == nil && ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return 3 * time.Second
}

// runCheckback measures how a second instance of a producer group resolves K
// orphaned half messages: K halves are sent by an instance that answers
// UNKNOWN (with COMMITTED txlog rows for half of them) and shuts down; once
// every half is older than the broker's transactionTimeOut, a fresh rmqtx
// producer of the same group starts, and the run ends when every committed
// event was delivered and every other one was answered ROLLBACK (fenced).
func runCheckback(ctx context.Context, e *Env) *Workload {
	o := e.Opt
	k := o.Halves
	txTimeout := brokerTxTimeout()
	w := &Workload{Name: "checkback", Params: map[string]string{
		"halves": fmt.Sprint(k), "committed": fmt.Sprint(k / 2), "fence_age": o.FenceAge.String(),
		"broker_tx_timeout": txTimeout.String(), "broker_check_interval": getenv("RMQTX_TX_CHECK_INTERVAL_MS", "2000") + "ms",
		"rounds": fmt.Sprint(o.Rounds),
	}}
	side := &Side{Name: sideCheckResol, Unit: "checks/s",
		Description: "fresh txproducer instance of the orphans' group: checks answered from the txlog (COMMIT) or fenced (ROLLBACK)"}
	w.Sides = []*Side{side}
	fail := func(err error) *Workload { w.Error = err.Error(); return w }

	store, err := newTxlog(ctx, e)
	if err != nil {
		return fail(err)
	}
	for r := 0; r < o.Rounds && ctx.Err() == nil; r++ {
		ro, err := checkbackRound(ctx, e, store, r+1, k, txTimeout)
		if err != nil {
			return fail(fmt.Errorf("round %d: %w", r+1, err))
		}
		side.Rounds = append(side.Rounds, ro)
		e.Log("  round %d %-32s %8.1f checks/s; resolved %d halves %.2fs after the orphan stopped, %.2fs after the 2nd instance started",
			r+1, side.Name, ro.Rate, k, ro.Extra["resolve_after_orphan_seconds"], ro.Extra["resolve_after_start_seconds"])
	}
	w.Notes = append(w.Notes,
		"checks/s = halves resolved / (last answer - first answer) on the 2nd instance: the client answers checks one at a time, each a txlog point lookup (+ a fence INSERT for the uncommitted half)",
		fmt.Sprintf("time to resolve is bounded below by the broker: a half is first checked once older than transactionTimeOut (%s), on a pass every transactionCheckInterval; see extra.resolve_after_orphan_seconds and extra.resolve_after_start_seconds in the JSON", txTimeout),
		"no raw side: the raw client has no way to answer for another instance's transactions")
	return w
}

func checkbackRound(ctx context.Context, e *Env, store *txlog.Store, index, k int, txTimeout time.Duration) (Round, error) {
	o := e.Opt
	topic, group := e.Names.Name("cbtopic"), e.Names.Name("cbgroup")
	if err := e.CreateTopic(ctx, topic, 4); err != nil {
		return Round{}, err
	}

	// Collector: what a consumer finally sees.
	var (
		mu        sync.Mutex
		delivered = map[string]bool{}
	)
	col, err := e.rawPushConsumer(e.Names.Name("cbcollect"), topic, 4, func(_ context.Context, m *primitive.MessageExt) error {
		mu.Lock()
		delivered[m.GetProperty(wire.PropEventID)] = true
		mu.Unlock()
		return nil
	})
	if err != nil {
		return Round{}, err
	}
	defer func() { _ = col.Shutdown() }()

	// The orphans.
	ids := make([]string, k)
	commit := map[string]bool{}
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-cb%d-%05d", e.Names.Run(), index, i)
		if i%2 == 0 {
			commit[ids[i]] = true
		}
	}
	l := &orphanListener{store: store, group: group, commit: commit}
	op, err := rmq.NewTransactionProducer(l,
		producer.WithNsResolver(e.S.Resolver()),
		producer.WithGroupName(group),
		producer.WithInstanceName(group+"-orphan-"+randHex(6)),
		producer.WithRetry(2),
	)
	if err != nil {
		return Round{}, err
	}
	if err := op.Start(); err != nil {
		return Round{}, err
	}
	sendErr := func() error {
		var (
			wg    sync.WaitGroup
			emu   sync.Mutex
			first error
			next  = make(chan int)
		)
		for wk := 0; wk < o.Concurrency; wk++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					_, err := op.SendMessageInTransaction(ctx, envelopeMessage(topic, ids[i], makePayload(o.Payload, int64(i))))
					if err != nil {
						emu.Lock()
						if first == nil {
							first = err
						}
						emu.Unlock()
					}
				}
			}()
		}
		for i := range ids {
			next <- i
		}
		close(next)
		wg.Wait()
		return first
	}()
	_ = op.Shutdown()
	orphanStopped := time.Now()
	if sendErr != nil {
		return Round{}, fmt.Errorf("orphan halves: %w", sendErr)
	}
	if l.err != nil {
		return Round{}, fmt.Errorf("orphan txlog rows: %w", l.err)
	}

	// Let every half pass transactionTimeOut, so one broker check pass
	// covers all of them and the answer window measures the checks, not the
	// spread of the halves' birth times.
	select {
	case <-time.After(txTimeout + 200*time.Millisecond - time.Since(orphanStopped)):
	case <-ctx.Done():
		return Round{}, ctx.Err()
	}

	// The second instance.
	var (
		amu                  sync.Mutex
		answered             = map[string]checkback.Decision{}
		tFirst, tLast        time.Time
		checks, unknowns     int
		checkTime            time.Duration
		wrongCommit, wrongRb int
	)
	onCheck := func(a checkback.Answer) {
		now := time.Now()
		amu.Lock()
		defer amu.Unlock()
		checks++
		checkTime += a.Duration
		if a.Decision == checkback.Unknown {
			unknowns++
			return
		}
		if _, seen := answered[a.EventID]; seen {
			return
		}
		if a.Decision == checkback.Commit && !commit[a.EventID] {
			wrongCommit++
		}
		if a.Decision == checkback.Rollback && commit[a.EventID] {
			wrongRb++
		}
		answered[a.EventID] = a.Decision
		if tFirst.IsZero() {
			tFirst = now
		}
		tLast = now
	}
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{e.S.NameServer}, Group: group, DB: e.DB, Log: store,
		FenceAge: o.FenceAge, WarmupTopics: []string{topic}, OnCheck: onCheck,
	})
	if err != nil {
		return Round{}, err
	}
	t0 := time.Now()
	if err := p.Start(ctx); err != nil {
		return Round{}, fmt.Errorf("second instance start: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Shutdown(sctx)
	}()
	startup := time.Since(t0)
	err = waitFor(ctx, o.Timeout, 5*time.Millisecond, func() (bool, error) {
		amu.Lock()
		resolved := len(answered)
		amu.Unlock()
		mu.Lock()
		got := len(delivered)
		mu.Unlock()
		return resolved == k && got >= len(commit), nil
	})
	tDone := time.Now()
	amu.Lock()
	resolved, wc, wr, nChecks, nUnknown, ct := len(answered), wrongCommit, wrongRb, checks, unknowns, checkTime
	window := tLast.Sub(tFirst)
	firstAt := tFirst
	amu.Unlock()
	mu.Lock()
	nDelivered := len(delivered)
	ghosts := 0
	for id := range delivered {
		if !commit[id] {
			ghosts++
		}
	}
	mu.Unlock()
	if err != nil {
		return Round{}, fmt.Errorf("resolved %d of %d halves, %d of %d committed delivered: %w", resolved, k, nDelivered, len(commit), err)
	}
	if wc+wr+ghosts > 0 {
		return Round{}, fmt.Errorf("CHECK FAILED: %d wrong commits, %d wrong rollbacks, %d ghost deliveries", wc, wr, ghosts)
	}
	fenced, err := store.Count(ctx, txlog.Filter{Group: group, ResolvedBy: txlog.ByFence})
	if err != nil {
		return Round{}, err
	}
	if fenced != k-len(commit) {
		return Round{}, fmt.Errorf("CHECK FAILED: %d fenced txlog rows, want %d", fenced, k-len(commit))
	}
	r := Round{Index: index, Count: int64(resolved), Seconds: window.Seconds(), Extra: map[string]float64{
		"resolve_after_orphan_seconds": tDone.Sub(orphanStopped).Seconds(),
		"resolve_after_start_seconds":  tDone.Sub(t0).Seconds(),
		"first_answer_after_start":     firstAt.Sub(t0).Seconds(),
		"start_seconds":                startup.Seconds(),
		"checks_answered":              float64(nChecks),
		"unknown_answers":              float64(nUnknown),
		"mean_check_ms":                ms(ct) / float64(max(1, nChecks)),
		"fenced_rows":                  float64(fenced),
		"committed_delivered":          float64(nDelivered),
	}}
	if window > 0 {
		r.Rate = float64(resolved) / window.Seconds()
	}
	return r, nil
}
