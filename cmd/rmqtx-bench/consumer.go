package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/wire"
)

// drain is a consumer that counts processed messages.
type drain struct {
	count func() int64
	stop  func()
}

// drainCPU measures the CPU each drain costs per message, and drainSplit,
// with -cpu-split, profiles each measured drain (both set by runConsumer).
var (
	drainCPU   cpuMeter
	drainSplit struct {
		s *cpuSplitter
		w *Workload
	}
)

// measureDrain starts a consumer and measures how fast it processes want
// messages: from the first processed message to the want-th, polled every
// 2ms (the same way for every side), so client start-up and rebalancing are
// not part of the rate. Wall time from start is kept in Extra, and so is the
// CPU per message of the bench process and of a local database server over
// the same window.
func measureDrain(ctx context.Context, e *Env, index int, want int64, start func() (*drain, error)) (Round, error) {
	t0 := time.Now()
	d, err := start()
	if err != nil {
		return Round{}, err
	}
	defer d.stop()
	var (
		tFirst time.Time
		c0     int64
		last   int64
		cpu0   cpuSample
	)
	split := drainSplit.s
	if index == 0 {
		split = nil // a warm-up drain
	}
	err = waitFor(ctx, e.Opt.Timeout, 2*time.Millisecond, func() (bool, error) {
		c := d.count()
		if c > 0 && tFirst.IsZero() {
			split.begin(drainSplit.w)
			tFirst, c0, cpu0 = time.Now(), c, drainCPU.sample()
		}
		last = c
		return c >= want, nil
	})
	tLast, cpu1 := time.Now(), drainCPU.sample()
	r := Round{Index: index, Count: want, Seconds: tLast.Sub(tFirst).Seconds(),
		Extra: map[string]float64{"wall_seconds": tLast.Sub(t0).Seconds(), "startup_seconds": tFirst.Sub(t0).Seconds()}}
	split.finishOps(drainSplit.w, &r, last-c0)
	if err != nil {
		return Round{}, fmt.Errorf("drained %d of %d messages: %w", last, want, err)
	}
	cpu0.perMessage(cpu1, last-c0, r.Extra)
	if r.Seconds > 0 && last > c0 {
		r.Rate = float64(last-c0) / r.Seconds
	}
	return r, nil
}

// runConsumer preloads N messages into a topic, then drains them with fresh
// groups: the raw push-consumer handler (business insert in its own
// transaction) and the rmqtx consumer (dedup row + the same insert). Then a
// second topic that holds the same event ids again is drained twice, every
// message a duplicate hit of the first-delivery group: warm, by the very
// Processor that applied them (its dedup cache answers), and cold, by a new
// consumer instance of the group (the database answers).
// checkedWork is what one checked hand-written side runs: its dedup row's
// insert and the locking read of a stored hash, its business insert, and
// what it saw of duplicates, conflicts and payloads unlike their hash.
type checkedWork struct {
	row, hash, insert          string
	dups, conflicts, malformed atomic.Int64
}

func newCheckedWork(row, hash string) *checkedWork { return &checkedWork{row: row, hash: hash} }

func runConsumer(ctx context.Context, e *Env) *Workload {
	o := e.Opt
	n := o.Messages
	drainCPU = newCPUMeter(e.S.DBAddr(), e.S.Broker)
	w := &Workload{Name: "consumer", Params: map[string]string{
		"goroutines": fmt.Sprint(o.Concurrency), "messages": fmt.Sprint(n), "payload": fmt.Sprint(o.Payload),
		"rounds": fmt.Sprint(o.Rounds), "batch": "1",
	}}
	raw := &Side{Name: sideRawHandler, Unit: "msgs/s", Description: "rocketmq-client-go push consumer; handler: BEGIN; business INSERT; COMMIT"}
	rawDedup := &Side{Name: sideRawDedup, Unit: "msgs/s", Description: "rocketmq-client-go push consumer; hand-written idempotent handler: BEGIN; INSERT IGNORE dedup row (group, event id); business INSERT unless it was there; COMMIT"}
	checked := &Side{Name: sideRawChecked, Unit: "msgs/s", Description: "the hand-written idempotent handler doing the work rmqtx's first delivery does by contract: each message under its own deadline (ProcessTimeout's default, 30 s), its id and type read and checked, the payload's SHA-256 checked against the declared hash and kept in the dedup row, a duplicate's stored hash read and compared (another payload under the same id is a conflict, not applied): BEGIN; INSERT IGNORE dedup row (group, id, type, hash); business INSERT unless it was there; COMMIT"}
	first := &Side{Name: sideFirst, Unit: "msgs/s", Description: "rmqtx consumer, first delivery: BEGIN; dedup INSERT; business INSERT; COMMIT"}
	batch := &Side{Name: sideBatch, Unit: "msgs/s", Description: fmt.Sprintf("rmqtx consumer, BatchTransaction (BatchSize %d): per delivered batch BEGIN; one dedup INSERT; per event business INSERT; COMMIT (savepoints only in the pass after a failure)", consumer.DefaultBatchTxSize)}
	cold := &Side{Name: sideDupCold, Unit: "msgs/s", Description: "duplicate hit (cold: new consumer instance of the group, DB dedup): BEGIN; dedup INSERT .. ON DUPLICATE KEY (hash check); ROLLBACK, then, once 48 of the last 64 were duplicates, one point read of the committed dedup row; handler not run"}
	warm := &Side{Name: sideDupWarm, Unit: "msgs/s", Description: "duplicate hit (warm: the Processor instance that applied them, dedup cache): no database round trip, handler not run"}
	noop := &Side{Name: sideNoopHandler, Unit: "msgs/s", Description: "rocketmq-client-go push consumer, handler does nothing: the client's own ceiling"}
	rawBatch := &Side{Name: sideRawBatch, Unit: "msgs/s", Description: fmt.Sprintf("rocketmq-client-go push consumer handing over up to %d messages of a queue at once; handler: BEGIN; business INSERT per message; COMMIT (no dedup: what batching alone gives this handler, the ceiling of any batch mode)", consumer.DefaultBatchTxSize)}
	firstNC := &Side{Name: sideFirstNoCount, Unit: "msgs/s", Description: "the same as rmqtx first delivery with ProcessorConfig.NoCrashCount: no attempt counted before the handler (a handler that kills its process is then redelivered for as long as it does), so what the crash count costs shows"}
	batchNC := &Side{Name: sideBatchNoCount, Unit: "msgs/s", Description: "the same as rmqtx batch mode with NoCrashCount"}
	rawBatchDedup := &Side{Name: sideRawBatchDedup, Unit: "msgs/s", Description: fmt.Sprintf("the raw batch handler (up to %d messages at once) made idempotent by hand: BEGIN; per message INSERT IGNORE of the dedup row (group, event id) and the business INSERT unless it was there; COMMIT", consumer.DefaultBatchTxSize)}
	rowChecked := &Side{Name: sideRawRowChecked, Unit: "msgs/s", Description: "raw handler + checked dedup writing, by hand, the dedup row rmqtx's Processor writes: the same columns and values (status, retry count, both times from the database clock) into a table with rmqtx's consume-log schema and its index on updated_at"}
	procRaw := &Side{Name: sideProcRaw, Unit: "msgs/s", Description: "rmqtx's Processor (the same configuration and handler as rmqtx first delivery) fed by the raw client's push consumer, one message per callback, as the raw sides are fed: MessageFromExt, Process, ACK unless a retry; so rmqtx's consumer without its push path (the stop gate, the order per key)"}
	procBatchRaw := &Side{Name: sideProcBatchRaw, Unit: "msgs/s", Description: fmt.Sprintf("rmqtx's Processor.ProcessBatch (the same handler as rmqtx batch mode) fed by the raw client's push consumer handing over up to %d messages at once: the batch shares one transaction and one dedup INSERT; so batch mode without its push path (the stop gate, the order per key and its rounds)", consumer.DefaultBatchTxSize)}
	w.Sides = []*Side{raw, rawDedup, checked, rowChecked, first, firstNC, procRaw, batch, batchNC, procBatchRaw, rawBatch, rawBatchDedup, cold, warm, noop}
	drainSplit.s, drainSplit.w = newCPUSplitter(e, w), w // nil without -cpu-split
	fail := func(err error) *Workload { w.Error = err.Error(); return w }

	topic, dupTopic := e.Names.Name("ctopic"), e.Names.Name("cdup")
	rawTable, txTable, dedupTable := e.Names.Name("orders_rawc"), e.Names.Name("orders_rmqtxc"), e.Names.Name("orders_rawdc")
	batchTable, rawBatchTable, rawBatchDedupTable := e.Names.Name("orders_batchc"), e.Names.Name("orders_rawbc"), e.Names.Name("orders_rawbdc")
	handDedup, checkedDedup, checkedTable := e.Names.Name("handdedup"), e.Names.Name("checkdedup"), e.Names.Name("orders_rawck")
	procTable, procBatchTable, rowTable := e.Names.Name("orders_procc"), e.Names.Name("orders_procbc"), e.Names.Name("orders_rowck")
	// Each rmqtx side has rmqtx's tables of its own, as each raw side has
	// its own table: sides sharing one consume log would each pay for the
	// others' rows (a deeper index, and autovacuum of a table several times
	// the size of a raw side's). The duplicate sides read the first
	// delivery's; the row by hand is written into a consume log of its own.
	prefixOf := map[string]string{}
	for side, kind := range map[string]string{sideFirst: "c", sideFirstNoCount: "cn", sideBatch: "cb", sideBatchNoCount: "cbn",
		sideProcRaw: "cp", sideProcBatchRaw: "cpb", sideRawRowChecked: "r"} {
		prefixOf[side] = e.Names.Name(kind) + "_"
	}
	prefix := prefixOf[sideFirst]
	for _, t := range []string{topic, dupTopic} {
		if err := e.CreateTopic(ctx, t, 4); err != nil {
			return fail(err)
		}
	}
	for _, t := range []string{rawTable, txTable, dedupTable, batchTable, rawBatchTable, rawBatchDedupTable, checkedTable, procTable, procBatchTable, rowTable} {
		if err := e.businessTable(ctx, t); err != nil {
			return fail(err)
		}
	}
	if err := e.handDedupTable(ctx, handDedup); err != nil {
		return fail(err)
	}
	if err := e.checkedDedupTable(ctx, checkedDedup); err != nil {
		return fail(err)
	}
	for _, p := range prefixOf {
		if err := schema.MigrateAll(ctx, e.DB, p); err != nil {
			return fail(fmt.Errorf("consumer migrate: %w", err))
		}
	}
	rowLog := prefixOf[sideRawRowChecked] + consumer.ConsumeLogTable

	// Preload: the same N events (rmqtx envelope) into both topics.
	p, err := e.newRawProducer(e.Names.Name("cpre"), 2)
	if err != nil {
		return fail(err)
	}
	t0 := time.Now()
	for _, t := range []string{topic, dupTopic} {
		msgs := make([]*primitive.Message, n)
		for i := range msgs {
			// Same id and payload in both topics: i-th message of each.
			id := fmt.Sprintf("%s-%06d", e.Names.Run(), i)
			msgs[i] = envelopeMessage(t, id, makePayload(o.Payload, int64(i)))
		}
		if err := e.preload(ctx, p, msgs); err != nil {
			_ = p.Shutdown()
			return fail(err)
		}
	}
	_ = p.Shutdown()
	e.Log("  preloaded %d messages into 2 topics in %s", n, time.Since(t0).Round(time.Millisecond))

	rawInsert, txInsert, dedupInsert := e.insertOrderSQL(rawTable), e.insertOrderSQL(txTable), e.insertOrderSQL(dedupTable)
	dedupRow := e.handDedupInsertSQL(handDedup)
	// startOneSide runs a raw push consumer (one message per callback)
	// whose handler is handle; the drain counts the messages handle
	// applied (a duplicate it absorbed is not counted).
	startOneSide := func(group string, handle func(ctx context.Context, m *primitive.MessageExt) (applied bool, err error)) func() (*drain, error) {
		return func() (*drain, error) {
			var c atomic.Int64
			pc, err := e.rawPushConsumer(group, topic, o.Concurrency, func(ctx context.Context, m *primitive.MessageExt) error {
				applied, err := handle(ctx, m)
				if applied {
					c.Add(1)
				}
				return err
			})
			if err != nil {
				return nil, err
			}
			return &drain{count: c.Load, stop: func() { _ = pc.Shutdown() }}, nil
		}
	}
	// inTx runs step in a transaction of its own and commits it when step
	// asks to (a duplicate is rolled back), as a raw handler does.
	inTx := func(ctx context.Context, step func(tx *sqlx.Tx) (commit bool, err error)) (committed bool, err error) {
		tx, err := e.DB.BeginTxx(ctx, nil)
		if err != nil {
			return false, err
		}
		commit, err := step(tx)
		if err != nil || !commit {
			_ = tx.Rollback()
			return false, err
		}
		if err := tx.Commit(); err != nil {
			return false, err
		}
		return true, nil
	}
	startNoop := func(group string) func() (*drain, error) {
		return startOneSide(group, func(context.Context, *primitive.MessageExt) (bool, error) { return true, nil })
	}
	startRaw := func(group string) func() (*drain, error) {
		return startOneSide(group, func(ctx context.Context, m *primitive.MessageExt) (bool, error) {
			return inTx(ctx, func(tx *sqlx.Tx) (bool, error) {
				_, err := tx.ExecContext(ctx, rawInsert, m.GetProperty(wire.PropEventID), int64(len(m.Body)), m.Body)
				return true, err
			})
		})
	}
	// handDedupStep is the hand-written idempotent step both raw dedup sides run
	// in their transaction: the dedup row, then, unless it was there (dup),
	// the business row. The caller rolls back on an error.
	handDedupStep := func(ctx context.Context, tx *sqlx.Tx, group, insert string, m *primitive.MessageExt) (dup bool, err error) {
		id := m.GetProperty(wire.PropEventID)
		res, err := tx.ExecContext(ctx, dedupRow, group, id)
		if err != nil {
			return false, err
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err == nil, err
		}
		_, err = tx.ExecContext(ctx, insert, id, int64(len(m.Body)), m.Body)
		return false, err
	}
	// startBatchSide runs a raw batch consumer whose handler runs each (the
	// business write, and its dedup on the dedup side) for every message
	// of a handed-over batch in one transaction; dups, when set, counts
	// the messages each found already applied.
	startBatchSide := func(group string, dups *atomic.Int64, each func(ctx context.Context, tx *sqlx.Tx, m *primitive.MessageExt) (bool, error)) func() (*drain, error) {
		return func() (*drain, error) {
			var c atomic.Int64
			pc, err := e.rawBatchConsumer(group, topic, o.Concurrency, consumer.DefaultBatchTxSize, func(ctx context.Context, msgs []*primitive.MessageExt) error {
				tx, err := e.DB.BeginTxx(ctx, nil)
				if err != nil {
					return err
				}
				var n int64
				for _, m := range msgs {
					dup, err := each(ctx, tx, m)
					if err != nil {
						_ = tx.Rollback()
						return err
					}
					if dup {
						n++ // a duplicate: no effect
					}
				}
				if err := tx.Commit(); err != nil {
					return err
				}
				if dups != nil {
					dups.Add(n)
				}
				c.Add(int64(len(msgs)))
				return nil
			})
			if err != nil {
				return nil, err
			}
			return &drain{count: c.Load, stop: func() { _ = pc.Shutdown() }}, nil
		}
	}
	// startRawBatch is batching without rmqtx: one transaction per handed
	// over batch, no dedup, so not exactly once. It bounds what any batch
	// mode can gain with this handler.
	rawBatchInsert := e.insertOrderSQL(rawBatchTable)
	startRawBatch := func(group string) func() (*drain, error) {
		return startBatchSide(group, nil, func(ctx context.Context, tx *sqlx.Tx, m *primitive.MessageExt) (bool, error) {
			_, err := tx.ExecContext(ctx, rawBatchInsert, m.GetProperty(wire.PropEventID), int64(len(m.Body)), m.Body)
			return false, err
		})
	}
	// startRawBatchDedup is the raw batch handler made idempotent the way
	// the hand-written handler below is, message by message in the batch's
	// transaction.
	rawBatchDedupInsert := e.insertOrderSQL(rawBatchDedupTable)
	var rawBatchDedupDups atomic.Int64
	startRawBatchDedup := func(group string) func() (*drain, error) {
		return startBatchSide(group, &rawBatchDedupDups, func(ctx context.Context, tx *sqlx.Tx, m *primitive.MessageExt) (bool, error) {
			return handDedupStep(ctx, tx, group, rawBatchDedupInsert, m)
		})
	}
	// startRawDedup is what a careful user writes without rmqtx: the dedup
	// row and the business row in one transaction, a duplicate rolled back.
	var rawDedupDups atomic.Int64
	startRawDedup := func(group string) func() (*drain, error) {
		return startOneSide(group, func(ctx context.Context, m *primitive.MessageExt) (bool, error) {
			return inTx(ctx, func(tx *sqlx.Tx) (bool, error) {
				dup, err := handDedupStep(ctx, tx, group, dedupInsert, m)
				if dup {
					rawDedupDups.Add(1) // ACK without the effect
				}
				return !dup, err
			})
		})
	}
	// startRawChecked is the careful hand-written handler that does what
	// rmqtx's first delivery does, so the two compare the same work: a
	// deadline per message (without one a lock wait or a silent database
	// holds the delivery), the envelope's id and type checked, the
	// payload's hash checked against the declared one and kept, and a
	// duplicate told apart from another payload under the same id. A
	// conflict or a payload unlike its declared hash would be parked by
	// rmqtx; here each is counted, and the run has none, so the check below
	// fails on any.
	checkedSQL, rowSQL := newCheckedWork(e.checkedDedupSQL(checkedDedup)), newCheckedWork(e.rowDedupSQL(rowLog))
	checkedSQL.insert, rowSQL.insert = e.insertOrderSQL(checkedTable), e.insertOrderSQL(rowTable)
	startRawChecked := func(group string, cw *checkedWork) func() (*drain, error) {
		return startOneSide(group, func(ctx context.Context, m *primitive.MessageExt) (bool, error) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			id, typ := m.GetProperty(wire.PropEventID), m.GetProperty(wire.PropEventType)
			if id == "" || typ != benchEventType {
				return false, fmt.Errorf("message %s: no event id or an unknown type", m.MsgId)
			}
			sum := sha256.Sum256(m.Body)
			hash := hex.EncodeToString(sum[:])
			if declared := m.GetProperty(wire.PropPayloadHash); declared != "" && !strings.EqualFold(declared, hash) {
				cw.malformed.Add(1)
				return false, nil
			}
			return inTx(ctx, func(tx *sqlx.Tx) (bool, error) {
				res, err := tx.ExecContext(ctx, cw.row, group, id, typ, hash)
				if err != nil {
					return false, err
				}
				if n, err := res.RowsAffected(); err != nil || n == 0 {
					var stored string
					if err == nil {
						err = tx.GetContext(ctx, &stored, cw.hash, group, id)
					}
					switch {
					case err != nil:
					case stored != hash:
						cw.conflicts.Add(1)
					default:
						cw.dups.Add(1)
					}
					return false, err // a duplicate or a conflict: ACK without the effect
				}
				_, err = tx.ExecContext(ctx, cw.insert, id, int64(len(m.Body)), m.Body)
				return true, err
			})
		})
	}
	// newProc is a Processor configured as the rmqtx sides' consumers
	// configure theirs, on the rmqtx tables of prefix, whose handler writes
	// the business row into table.
	newProc := func(group, prefix, table string) (*consumer.Processor, error) {
		insert := e.insertOrderSQL(table)
		return consumer.NewProcessor(consumer.ProcessorConfig{
			Group: group, DB: e.DB, TablePrefix: prefix, VersionMode: consumer.VersionNone,
			Routes: map[string]consumer.Route{benchEventType: {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
				_, err := tx.ExecContext(ctx, insert, ev.ID, int64(len(ev.Payload)), ev.Payload)
				return err
			}}},
		})
	}
	// notAcked is the error a raw-fed Processor side hands back for an
	// outcome that is not an ACK (the client then redelivers the message).
	notAcked := func(o consumer.Outcome) error { return fmt.Errorf("%s: %w", o.Result, o.Err) }
	// startProcRaw feeds a Processor the way the raw sides are fed.
	startProcRaw := func(group string) func() (*drain, error) {
		return func() (*drain, error) {
			proc, err := newProc(group, prefixOf[sideProcRaw], procTable)
			if err != nil {
				return nil, err
			}
			return startOneSide(group, func(ctx context.Context, m *primitive.MessageExt) (bool, error) {
				out := proc.Process(ctx, consumer.MessageFromExt(m))
				if !out.Ack() {
					return false, notAcked(out)
				}
				return out.Result == consumer.ResultApplied, nil
			})()
		}
	}
	// startProcBatchRaw feeds ProcessBatch the batches the raw batch
	// consumer hands over; a batch with an outcome that is not an ACK is
	// handed back whole (its applied events come back as duplicates).
	startProcBatchRaw := func(group string) func() (*drain, error) {
		return func() (*drain, error) {
			proc, err := newProc(group, prefixOf[sideProcBatchRaw], procBatchTable)
			if err != nil {
				return nil, err
			}
			var c atomic.Int64
			pc, err := e.rawBatchConsumer(group, topic, o.Concurrency, consumer.DefaultBatchTxSize, func(ctx context.Context, msgs []*primitive.MessageExt) error {
				in := make([]consumer.Message, len(msgs))
				for i, m := range msgs {
					in[i] = consumer.MessageFromExt(m)
				}
				var applied int64
				for _, out := range proc.ProcessBatch(ctx, in) {
					if !out.Ack() {
						return notAcked(out)
					}
					if out.Result == consumer.ResultApplied {
						applied++
					}
				}
				c.Add(applied)
				return nil
			})
			if err != nil {
				return nil, err
			}
			return &drain{count: c.Load, stop: func() { _ = pc.Shutdown() }}, nil
		}
	}
	batchInsert := e.insertOrderSQL(batchTable)
	// batchTxs counts the transactions the batch handler ran in (the
	// transactions seen, kept for the round), to report the batches'
	// real size.
	var (
		batchMu  sync.Mutex
		batchTxs = map[*sqlx.Tx]bool{}
	)
	batchHandler := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		batchMu.Lock()
		batchTxs[tx] = true
		batchMu.Unlock()
		_, err := tx.ExecContext(ctx, batchInsert, ev.ID, int64(len(ev.Payload)), ev.Payload)
		return err
	}
	// startBatch runs a consumer.Consumer in batch mode on the rmqtx
	// tables of prefix.
	startBatch := func(group, prefix string, noCount bool) func() (*drain, error) {
		return func() (*drain, error) {
			c, err := consumer.New(consumer.Config{
				Group: group, DB: e.DB, TablePrefix: prefix, NoCrashCount: noCount,
				Routes:           map[string]consumer.Route{benchEventType: {Handler: batchHandler}},
				VersionMode:      consumer.VersionNone,
				NameServers:      []string{e.S.NameServer},
				Topic:            topic,
				Goroutines:       o.Concurrency,
				BatchTransaction: true,
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
	var handlerRuns atomic.Int64
	handler := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		if _, err := tx.ExecContext(ctx, txInsert, ev.ID, int64(len(ev.Payload)), ev.Payload); err != nil {
			return err
		}
		handlerRuns.Add(1)
		return nil
	}
	// startRmqtx runs a new consumer.Consumer (a new instance: empty dedup
	// cache) on the rmqtx tables of prefix; keep, when set, receives it (its
	// Processor outlives Shutdown).
	startRmqtx := func(group, prefix, t string, duplicates, noCount bool, keep func(*consumer.Consumer)) func() (*drain, error) {
		return func() (*drain, error) {
			c, err := consumer.New(consumer.Config{
				Group: group, DB: e.DB, TablePrefix: prefix, NoCrashCount: noCount,
				Routes:      map[string]consumer.Route{benchEventType: {Handler: handler}},
				VersionMode: consumer.VersionNone,
				NameServers: []string{e.S.NameServer},
				Topic:       t,
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
			if keep != nil {
				keep(c)
			}
			count := func() int64 {
				st := c.Processor().Stats()
				if duplicates {
					return st.Duplicates
				}
				return st.Applied
			}
			stop := func() {
				sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_ = c.Shutdown(sctx)
			}
			return &drain{count: count, stop: stop}, nil
		}
	}
	// startWarm drains the duplicates through proc, the Processor that
	// applied them, fed by a push consumer of its own broker group (proc's
	// dedup group is unchanged) the way consumer.Consumer feeds it with
	// BatchSize 1: MessageFromExt, Process, ACK unless a retry.
	startWarm := func(group string, proc *consumer.Processor) func() (*drain, error) {
		return func() (*drain, error) {
			base := proc.Stats().Duplicates
			pc, err := e.rawPushConsumer(group, dupTopic, o.Concurrency, func(ctx context.Context, m *primitive.MessageExt) error {
				if out := proc.Process(ctx, consumer.MessageFromExt(m)); !out.Ack() {
					return fmt.Errorf("%s: %w", out.Result, out.Err)
				}
				return nil
			})
			if err != nil {
				return nil, err
			}
			count := func() int64 { return proc.Stats().Duplicates - base }
			return &drain{count: count, stop: func() { _ = pc.Shutdown() }}, nil
		}
	}
	cacheHits := func(c *consumer.Consumer) float64 {
		if c == nil {
			return 0
		}
		return float64(c.Processor().DedupCacheStats().Hits)
	}

	// Warm-up: a throw-away group of each kind drains the topic once (not
	// measured), so the broker's page cache, the connection pool and the
	// JIT-compiled paths are warm for both sides alike.
	if o.Warmup > 0 {
		if _, err := measureDrain(ctx, e, 0, int64(n), startRaw(e.Names.Name("cwarmraw"))); err != nil {
			return fail(fmt.Errorf("warm-up raw: %w", err))
		}
		if _, err := measureDrain(ctx, e, 0, int64(n), startRmqtx(e.Names.Name("cwarmtx"), prefix, topic, false, false, nil)); err != nil {
			return fail(fmt.Errorf("warm-up rmqtx: %w", err))
		}
		e.Log("  warm-up done")
	}

	order := []string{sideRawHandler, sideRawDedup, sideRawChecked, sideRawRowChecked, sideFirst, sideFirstNoCount, sideProcRaw, sideBatch, sideBatchNoCount, sideProcBatchRaw, sideRawBatch, sideRawBatchDedup}
	dupOrder := []string{sideDupWarm, sideDupCold}
	logRound := func(r int, name string, ro Round) {
		cpu := fmt.Sprintf(", cpu/msg: bench %.0fus", ro.Extra["bench_cpu_us_per_msg"])
		if v, ok := ro.Extra["db_cpu_us_per_msg"]; ok {
			cpu += fmt.Sprintf(" db %.0fus", v)
		}
		if v, ok := ro.Extra["broker_cpu_us_per_msg"]; ok {
			cpu += fmt.Sprintf(" broker %.0fus", v)
		}
		if v, ok := ro.Extra["events_per_tx"]; ok {
			cpu += fmt.Sprintf(", %.1f events per transaction", v)
		}
		e.Log("  round %d %-42s %8.1f msgs/s (%.2fs, start-up %.2fs%s)", r+1, name, ro.Rate, ro.Seconds, ro.Extra["startup_seconds"], cpu)
		drainSplit.s.save(w, name, r+1)
	}
	var warmMisses, coldHits int64
	for r := 0; r < o.Rounds && ctx.Err() == nil; r++ {
		// Every side drains into a fresh group of its own each round.
		group := func(kind string) string { return e.Names.Name(kind) }
		sides := map[string]struct {
			side  *Side
			start func() (*drain, error)
		}{
			sideRawHandler:    {raw, startRaw(group("craw"))},
			sideRawDedup:      {rawDedup, startRawDedup(group("crawd"))},
			sideRawChecked:    {checked, startRawChecked(group("crawck"), checkedSQL)},
			sideRawRowChecked: {rowChecked, startRawChecked(group("crowck"), rowSQL)},
			sideFirstNoCount:  {firstNC, startRmqtx(group("cnc"), prefixOf[sideFirstNoCount], topic, false, true, nil)},
			sideProcRaw:       {procRaw, startProcRaw(group("cproc"))},
			sideBatchNoCount:  {batchNC, startBatch(group("cncb"), prefixOf[sideBatchNoCount], true)},
			sideProcBatchRaw:  {procBatchRaw, startProcBatchRaw(group("cprocb"))},
			sideRawBatch:      {rawBatch, startRawBatch(group("crawb"))},
			sideRawBatchDedup: {rawBatchDedup, startRawBatchDedup(group("crawbd"))},
		}
		txGroup, batchGroup := group("ctx"), group("cbatch")
		var applier *consumer.Consumer // the first-delivery instance of this round
		for _, name := range rotate(order, r) {
			var (
				ro  Round
				err error
			)
			switch name {
			case sideBatch:
				batchMu.Lock()
				clear(batchTxs)
				batchMu.Unlock()
				ro, err = measureDrain(ctx, e, r+1, int64(n), startBatch(batchGroup, prefixOf[sideBatch], false))
				if err == nil {
					batchMu.Lock()
					if len(batchTxs) > 0 {
						ro.Extra["events_per_tx"] = float64(n) / float64(len(batchTxs))
					}
					batchMu.Unlock()
					batch.Rounds = append(batch.Rounds, ro)
				}
			case sideFirst:
				ro, err = measureDrain(ctx, e, r+1, int64(n), startRmqtx(txGroup, prefix, topic, false, false, func(c *consumer.Consumer) { applier = c }))
				if err == nil {
					first.Rounds = append(first.Rounds, ro)
				}
			default:
				sd := sides[name]
				ro, err = measureDrain(ctx, e, r+1, int64(n), sd.start)
				if err == nil {
					sd.side.Rounds = append(sd.side.Rounds, ro)
				}
			}
			if err != nil {
				return fail(fmt.Errorf("round %d %s: %w", r+1, name, err))
			}
			logRound(r, name, ro)
		}
		// Duplicates of what the first-delivery group just applied (every
		// dedup row exists): warm through the same Processor, cold through a
		// new instance of the group; the order alternates.
		for _, name := range rotate(dupOrder, r) {
			var (
				ro  Round
				err error
			)
			if name == sideDupWarm {
				before := cacheHits(applier)
				ro, err = measureDrain(ctx, e, r+1, int64(n), startWarm(e.Names.Name("cwarm"), applier.Processor()))
				if err == nil {
					ro.Extra["cache_hits"] = cacheHits(applier) - before
					warmMisses += int64(n) - int64(ro.Extra["cache_hits"])
					warm.Rounds = append(warm.Rounds, ro)
				}
			} else {
				var inst *consumer.Consumer
				ro, err = measureDrain(ctx, e, r+1, int64(n), startRmqtx(txGroup, prefix, dupTopic, true, false, func(c *consumer.Consumer) { inst = c }))
				if err == nil {
					ro.Extra["cache_hits"] = cacheHits(inst)
					coldHits += int64(ro.Extra["cache_hits"])
					cold.Rounds = append(cold.Rounds, ro)
				}
			}
			if err != nil {
				return fail(fmt.Errorf("round %d %s: %w", r+1, name, err))
			}
			logRound(r, name, ro)
		}
		// The client's ceiling: a handler that does nothing.
		ro, err := measureDrain(ctx, e, r+1, int64(n), startNoop(e.Names.Name("cnoop")))
		if err != nil {
			return fail(fmt.Errorf("round %d %s: %w", r+1, sideNoopHandler, err))
		}
		noop.Rounds = append(noop.Rounds, ro)
		logRound(r, sideNoopHandler, ro)
	}

	// Effects: the rmqtx handler ran once per (group, event) - warm-up group
	// and the NoCrashCount side's groups included (they share the handler
	// and the table) - and never for a duplicate.
	rounds := int64(len(first.Rounds) + len(firstNC.Rounds))
	warmup := int64(0)
	if o.Warmup > 0 {
		warmup = 1
	}
	if got, wantRuns := handlerRuns.Load(), (rounds+warmup)*int64(n); got != wantRuns {
		w.Notes = append(w.Notes, fmt.Sprintf("rmqtx handler ran %d times for %d (group, event) pairs (redeliveries of rolled-back attempts count too)", got, wantRuns))
	}
	if rows, err := e.countRows(ctx, txTable); err == nil {
		if int64(rows) != (rounds+warmup)*int64(n) {
			w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %d rmqtx business rows for %d (group, event) pairs", rows, (rounds+warmup)*int64(n)))
		} else {
			e.Log("  check: %d rmqtx business rows = %d groups x %d events; 0 effects from %d duplicate deliveries", rows, rounds+warmup, n, int64(len(cold.Rounds)+len(warm.Rounds))*int64(n))
		}
	}
	if rows, err := e.countRows(ctx, batchTable); err == nil && int64(rows) != int64(len(batch.Rounds)+len(batchNC.Rounds))*int64(n) {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %d batch-mode business rows for %d (group, event) pairs", rows, int64(len(batch.Rounds)+len(batchNC.Rounds))*int64(n)))
	}
	if rows, err := e.countRows(ctx, rawBatchTable); err == nil && int64(rows) < int64(len(rawBatch.Rounds))*int64(n) {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %d raw batch business rows for %d (group, event) pairs", rows, int64(len(rawBatch.Rounds))*int64(n)))
	}
	if rows, err := e.countRows(ctx, dedupTable); err == nil && int64(rows) != int64(len(rawDedup.Rounds))*int64(n) {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %d hand-written dedup business rows for %d (group, event) pairs", rows, int64(len(rawDedup.Rounds))*int64(n)))
	}
	if rows, err := e.countRows(ctx, rawBatchDedupTable); err == nil && int64(rows) != int64(len(rawBatchDedup.Rounds))*int64(n) {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %d hand-written batch dedup business rows for %d (group, event) pairs", rows, int64(len(rawBatchDedup.Rounds))*int64(n)))
	}
	// The two checked hand-written sides: one business row per (group,
	// event); every dedup row matched by its business row's payload hash;
	// no conflict, no payload unlike its declared hash.
	for _, c := range []struct {
		what, dedup, table string
		side               *Side
		work               *checkedWork
	}{{"raw handler + checked dedup", checkedDedup, checkedTable, checked, checkedSQL}, {"raw handler + rmqtx's dedup row by hand", rowLog, rowTable, rowChecked, rowSQL}} {
		if rows, err := e.countRows(ctx, c.table); err == nil && int64(rows) != int64(len(c.side.Rounds))*int64(n) {
			w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %s: %d business rows for %d (group, event) pairs", c.what, rows, int64(len(c.side.Rounds))*int64(n)))
		}
		if bad, err := e.checkedHashMismatches(ctx, c.dedup, c.table); err != nil || bad > 0 {
			w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %s: %d dedup rows without a business row whose payload has the stored SHA-256 (error: %v)", c.what, bad, err))
		}
		if k, b := c.work.conflicts.Load(), c.work.malformed.Load(); k > 0 || b > 0 {
			w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %s saw %d payload-hash conflicts and %d payloads unlike their declared hash (the run has none)", c.what, k, b))
		}
		if d := c.work.dups.Load(); d > 0 {
			w.Notes = append(w.Notes, fmt.Sprintf("%s absorbed %d redeliveries", c.what, d))
		}
	}
	// The row by hand is the row rmqtx writes: both logs filled alike.
	if mine, err1 := e.consumeLogShape(ctx, prefix+consumer.ConsumeLogTable); err1 != nil {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: consume log shape: %v", err1))
	} else if byHand, err2 := e.consumeLogShape(ctx, rowLog); err2 != nil || byHand != mine {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: the dedup rows written by hand are not filled as rmqtx fills its own: %q against %q (error: %v)", byHand, mine, err2))
	}
	if d := rawBatchDedupDups.Load(); d > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("raw batch handler + dedup absorbed %d redeliveries", d))
	}
	if d := rawDedupDups.Load(); d > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("raw handler + dedup absorbed %d redeliveries", d))
	}
	w.Notes = append(w.Notes,
		"rate = messages processed from the first to the last one (polled every 2ms), so client start-up and rebalancing are excluded; wall time with start-up is in the JSON (extra.wall_seconds)",
		"every round uses fresh consumer groups on one preloaded topic; both duplicate sides re-read the same ids from a second topic as dedup hits of the first-delivery group",
		"cold = a new consumer.Consumer of the group (empty cache): the database decides every duplicate, the first 48 by BEGIN; dedup INSERT .. ON DUPLICATE KEY; ROLLBACK, the rest by a point read of the committed row (duplicate-storm mode); warm = the Processor that applied the events, fed by a push consumer: its dedup cache answers with no database round trip; the 2x target is checked on cold")
	if warmMisses != 0 || coldHits != 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("dedup cache: %d warm duplicates missed the cache (DedupCacheSize %d, messages %d), %d cold duplicates hit it (redeliveries)",
			warmMisses, consumer.DefaultDedupCacheSize, n, coldHits))
	}
	drainSplit.s.summarize(e, w)
	return w
}
