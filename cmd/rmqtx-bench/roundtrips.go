package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/sqlcount"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// Count is one path's statement and round-trip counts per operation, read
// from the server's session counters (SHOW SESSION STATUS: Questions,
// Com_stmt_prepare/execute/close, Com_begin, ...) on a one-connection pool.
type Count struct {
	Path    string             `json:"path"`
	Ops     int64              `json:"ops"`
	Per     map[string]float64 `json:"per_op"` // counter -> per operation; round_trips = Questions + Com_stmt_prepare
	Summary string             `json:"summary"`
}

// runRoundTrips counts what each path costs the database per operation,
// after a warm-up (rmqtx's statements are prepared once per connection):
// the raw sides and rmqtx on the same DSN (the run's, default: no
// interpolateParams; see -dsn-params).
func runRoundTrips(ctx context.Context, e *Env) *Workload {
	o := e.Opt
	w := &Workload{Name: "roundtrips", Params: map[string]string{"dsn_params": o.DSNParams, "ops": "20"}}
	fail := func(err error) *Workload { w.Error = err.Error(); return w }
	if e.pg() {
		w.Notes = append(w.Notes, "skipped: the counts are MySQL's session counters (SHOW SESSION STATUS); PostgreSQL has no per-session equivalent")
		return w
	}
	one, err := sqlcount.Single(e.S.DSN(e.DBName))
	if err != nil {
		return fail(err)
	}
	defer func() { _ = one.Close() }()
	m, err := sqlcount.NewMeter(ctx, one)
	if err != nil {
		return fail(err)
	}
	const ops = 20
	// measure runs op until a run needs no PREPARE of rmqtx's own (warm:
	// in-transaction statements are prepared in the background after their
	// first use), then counts ops more runs.
	measure := func(path string, op func(i int) error) error {
		var seq atomic.Int64
		run := func(n int) error {
			for i := 0; i < n; i++ {
				if err := op(int(seq.Add(1))); err != nil {
					return err
				}
			}
			return nil
		}
		var last sqlcount.Counters
		for try := 0; try < 20; try++ {
			c, err := m.Measure(ctx, func() error { return run(1) })
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if try > 0 && c == last {
				break // two warm runs alike
			}
			last = c
			time.Sleep(20 * time.Millisecond) // let a background prepare take the connection
		}
		c, err := m.Measure(ctx, func() error { return run(ops) })
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		per := c.Div(ops)
		w.Counts = append(w.Counts, Count{Path: path, Ops: ops, Per: per, Summary: perOp(per)})
		e.Log("  %-52s %s", path, perOp(per))
		return nil
	}

	biz := e.Names.Name("orders_rt")
	if err := e.businessTable(ctx, biz); err != nil {
		return fail(err)
	}
	insert := e.insertOrderSQL(biz)
	handLog := e.Names.Name("handlog_rt")
	if _, err := e.DB.ExecContext(ctx, `CREATE TABLE `+handLog+` (
  event_id VARCHAR(64) NOT NULL PRIMARY KEY, topic VARCHAR(255) NOT NULL, state VARCHAR(16) NOT NULL,
  payload MEDIUMBLOB NULL, created_at DATETIME(6) NOT NULL) ENGINE=InnoDB`); err != nil {
		return fail(err)
	}
	handDedup := e.Names.Name("handdedup_rt")
	if _, err := e.DB.ExecContext(ctx, `CREATE TABLE `+handDedup+` (
  consumer_group VARCHAR(255) NOT NULL, event_id VARCHAR(64) NOT NULL, created_at DATETIME(6) NOT NULL,
  PRIMARY KEY (consumer_group, event_id)) ENGINE=InnoDB`); err != nil {
		return fail(err)
	}
	payload := makePayload(o.Payload, 1)
	localTx := func(stmts func(tx *sqlx.Tx, id string) error) func(int) error {
		return func(int) error {
			tx, err := one.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			if err := stmts(tx, wire.NewEventID()); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}
	}
	bizInsert := func(tx *sqlx.Tx, id string) error {
		_, err := tx.ExecContext(ctx, insert, id, int64(len(payload)), payload)
		return err
	}

	// Producer: the local transactions.
	if err := measure("producer local tx, raw: BEGIN; business INSERT; COMMIT", localTx(bizInsert)); err != nil {
		return fail(err)
	}
	logInsert := "INSERT INTO " + handLog + " (event_id, topic, state, payload, created_at) VALUES (?, 't', 'COMMITTED', ?, UTC_TIMESTAMP(6))"
	if err := measure("producer local tx, raw + hand-written log INSERT", localTx(func(tx *sqlx.Tx, id string) error {
		if _, err := tx.ExecContext(ctx, logInsert, id, payload); err != nil {
			return err
		}
		return bizInsert(tx, id)
	})); err != nil {
		return fail(err)
	}
	// Producer: a whole rmqtx Send through the broker, database side.
	if err := e.countSend(ctx, one, measure, insert, payload); err != nil {
		return fail(err)
	}

	// Consumer: the handlers and the processor, fed messages directly.
	group := e.Names.Name("rtg")
	dedupRow := "INSERT IGNORE INTO " + handDedup + " (consumer_group, event_id, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))"
	if err := measure("consumer, raw handler + dedup: BEGIN; INSERT IGNORE; INSERT; COMMIT", localTx(func(tx *sqlx.Tx, id string) error {
		if _, err := tx.ExecContext(ctx, dedupRow, group, id); err != nil {
			return err
		}
		return bizInsert(tx, id)
	})); err != nil {
		return fail(err)
	}
	prefix := e.Names.Name("rtc") + "_"
	if err := schema.MigrateAll(ctx, e.DB, prefix); err != nil {
		return fail(err)
	}
	handler := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		_, err := tx.ExecContext(ctx, insert, ev.ID, int64(len(ev.Payload)), ev.Payload)
		return err
	}
	proc, err := consumer.NewProcessor(consumer.ProcessorConfig{
		Group: group, DB: one, TablePrefix: prefix, VersionMode: consumer.VersionNone, DedupCacheSize: -1,
		Routes: map[string]consumer.Route{benchEventType: {Handler: handler}},
	})
	if err != nil {
		return fail(err)
	}
	var seen []consumer.Message
	process := func(m consumer.Message, want consumer.Result) error {
		if out := proc.Process(ctx, m); out.Result != want {
			return fmt.Errorf("outcome %s, want %s (%v)", out.Result, want, out.Err)
		}
		return nil
	}
	if err := measure("consumer, rmqtx first delivery (same INSERT in the handler)", func(i int) error {
		msg := consumerMessage(fmt.Sprintf("%s-rt-%06d", e.Names.Run(), i), payload)
		seen = append(seen, msg)
		return process(msg, consumer.ResultApplied)
	}); err != nil {
		return fail(err)
	}
	if err := measure("consumer, rmqtx duplicate decided by the database", func(i int) error {
		return process(seen[i%len(seen)], consumer.ResultDuplicate)
	}); err != nil {
		return fail(err)
	}
	// Batch mode: per event of a batch of DefaultBatchTxSize.
	var batchSeq atomic.Int64
	bs := consumer.DefaultBatchTxSize
	before := len(w.Counts)
	if err := measure(fmt.Sprintf("consumer, rmqtx batch mode, batch of %d (per batch)", bs), func(int) error {
		msgs := make([]consumer.Message, bs)
		for j := range msgs {
			msgs[j] = consumerMessage(fmt.Sprintf("%s-rtb-%07d", e.Names.Run(), batchSeq.Add(1)), payload)
		}
		for _, out := range proc.ProcessBatch(ctx, msgs) {
			if out.Result != consumer.ResultApplied {
				return fmt.Errorf("batch outcome %s (%v)", out.Result, out.Err)
			}
		}
		return nil
	}); err != nil {
		return fail(err)
	}
	if len(w.Counts) > before { // the same figures per event
		c := w.Counts[len(w.Counts)-1]
		per := map[string]float64{}
		for k, v := range c.Per {
			per[k] = v / float64(bs)
		}
		w.Counts[len(w.Counts)-1] = Count{Path: fmt.Sprintf("consumer, rmqtx batch mode, batch of %d (per event)", bs), Ops: c.Ops * int64(bs), Per: per, Summary: perOp(per)}
	}

	// Check-back: the txlog reads and the fence.
	rtl := e.Names.Name("rtl") + "_"
	store, err := txlog.New(one, rtl)
	if err != nil {
		return fail(err)
	}
	if err := schema.MigrateAll(ctx, one, rtl); err != nil {
		return fail(err)
	}
	committedID := wire.NewEventID()
	if err := localTx(func(tx *sqlx.Tx, _ string) error {
		return store.Insert(ctx, tx, txlog.Row{EventID: committedID, State: txlog.StateCommitted, ResolvedBy: txlog.ByLocalCommit})
	})(0); err != nil {
		return fail(err)
	}
	if err := measure("check-back, committed row: txlog Get", func(int) error {
		_, err := store.Get(ctx, committedID)
		return err
	}); err != nil {
		return fail(err)
	}
	if err := measure("check-back past the fence age, no row: txlog Fence", func(int) error {
		_, _, err := store.Fence(ctx, txlog.Row{EventID: wire.NewEventID(), ResolvedBy: txlog.ByFence})
		return err
	}); err != nil {
		return fail(err)
	}

	// Outbox: per row, with a sink that does nothing.
	if err := e.countOutbox(ctx, one, m, w); err != nil {
		return fail(err)
	}
	w.Notes = append(w.Notes,
		"counted by the server (SHOW SESSION STATUS before and after, on a pool of one connection, the SHOW itself subtracted), per operation, after a warm-up: round trips = Questions (text statements and prepared executions) + Com_stmt_prepare; a Com_stmt_close has no reply",
		"the business INSERT is the user's statement and runs through database/sql as users write it: with the default DSN it is a PREPARE, an EXECUTE and a CLOSE (2 round trips); rmqtx's own statements are prepared once per connection and cost 1 round trip each (package internal/stmtcache)")
	return w
}

func perOp(p map[string]float64) string {
	return fmt.Sprintf("%.2f round trips (%.2f statements, %.2f prepares, %.2f closes; begin %.2f, commit %.2f, rollback %.2f, savepoint %.2f, insert %.2f, select %.2f, update %.2f, delete %.2f, set %.2f)",
		p["round_trips"], p["questions"], p["com_stmt_prepare"], p["com_stmt_close"], p["com_begin"], p["com_commit"],
		p["com_rollback"]+p["com_rollback_to_savepoint"], p["com_savepoint"], p["com_insert"], p["com_select"], p["com_update"], p["com_delete"], p["com_set_option"])
}

// consumerMessage is a first delivery of an rmqtx event.
func consumerMessage(id string, payload []byte) consumer.Message {
	env := wire.Envelope{EventID: id, EventType: benchEventType}
	return consumer.Message{Body: payload, Properties: env.Properties(payload),
		Delivery: consumer.Delivery{Topic: "rt", MsgID: "m-" + id, StoredAt: time.Now().UTC()}}
}

// countSend counts a whole txproducer.Send (half message, local
// transaction, end) on a one-connection pool: what the database sees, with
// the id assigned by rmqtx and with a caller-supplied one.
func (e *Env) countSend(ctx context.Context, one *sqlx.DB, measure func(string, func(int) error) error, insert string, payload []byte) error {
	topic, group := e.Names.Name("prt"), e.Names.Name("prtg")
	if err := e.CreateTopic(ctx, topic, 4); err != nil {
		return err
	}
	rtp := e.Names.Name("rtp") + "_"
	store, err := txlog.New(one, rtp)
	if err != nil {
		return err
	}
	if err := schema.MigrateAll(ctx, one, rtp); err != nil {
		return err
	}
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{e.S.NameServer}, Group: group, DB: one, Log: store, WarmupTopics: []string{topic},
		DisablePayloadStorage: e.Opt.NoPayload,
	})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return fmt.Errorf("txproducer start: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Shutdown(sctx)
	}()
	send := func(supplied bool) func(int) error {
		return func(int) error {
			id := wire.NewEventID()
			msg := txproducer.Message{Topic: topic, Tags: benchEventType, EventType: benchEventType, Payload: payload}
			if supplied {
				msg.EventID = id
			}
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
		}
	}
	if err := measure("producer, rmqtx Send (id assigned by rmqtx)", send(false)); err != nil {
		return err
	}
	return measure("producer, rmqtx Send with a caller-supplied EventID", send(true))
}

// countOutbox counts one dispatcher draining rows through a sink that does
// nothing, per row.
func (e *Env) countOutbox(ctx context.Context, one *sqlx.DB, m *sqlcount.Meter, w *Workload) error {
	const rows = 200
	prefix := e.Names.Name("rto") + "_"
	table, err := outbox.NewTable(prefix)
	if err != nil {
		return err
	}
	if err := schema.MigrateAll(ctx, e.DB, prefix); err != nil {
		return err
	}
	var seq atomic.Int64
	fill := func() error {
		tx, err := e.DB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		for i := 0; i < rows; i++ {
			s := seq.Add(1)
			if _, err := table.Enqueue(ctx, tx, outbox.Event{EventID: fmt.Sprintf("%s-rto%07d", e.Names.Run(), s),
				EventType: benchEventType, Destination: "rt", Payload: makePayload(e.Opt.Payload, s)}); err != nil {
				_ = tx.Rollback()
				return err
			}
		}
		return tx.Commit()
	}
	// drain returns once every row is SENT, leaving the dispatcher running
	// (stopping it cancels its idle claim, and the driver then drops the
	// connection the counters are read from); stop stops it.
	var stop func()
	drain := func() error {
		var sent atomic.Int64
		done := make(chan struct{})
		cfg := outbox.Config{DB: one, TablePrefix: prefix, Concurrency: 8, Name: "rt-" + randHex(4),
			Sink: outbox.FuncSink(func(context.Context, *outbox.Message) error { return nil }),
			OnOutcome: func(o outbox.Outcome) {
				if o.Status == outbox.StatusSent && sent.Add(1) == rows {
					close(done)
				}
			}}
		d, err := outbox.NewDispatcher(cfg)
		if err != nil {
			return err
		}
		if err := d.Start(ctx); err != nil {
			return err
		}
		stop = func() { _ = d.Shutdown(context.Background()) }
		select {
		case <-done:
			return nil
		case <-time.After(60 * time.Second):
			return fmt.Errorf("outbox: %d of %d rows sent", sent.Load(), rows)
		}
	}
	if err := fill(); err != nil {
		return err
	}
	err = drain() // warm-up
	stop()
	if err != nil {
		return err
	}
	if err := fill(); err != nil {
		return err
	}
	c, err := m.Measure(ctx, drain)
	stop()
	if err != nil {
		return err
	}
	path := "outbox, one dispatcher, no-op sink (per row)"
	per := c.Div(rows)
	w.Counts = append(w.Counts, Count{Path: path, Ops: rows, Per: per, Summary: perOp(per)})
	e.Log("  %-52s %s", path, perOp(per))
	return nil
}
