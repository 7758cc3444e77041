package main

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// runLocalTx isolates the database part of the producer: the raw listener's
// local transaction (BEGIN; business INSERT; COMMIT) against rmqtx's (BEGIN;
// txlog INSERT of the row txproducer writes; business INSERT; COMMIT), with
// no broker. It explains how much of the producer ratio is the txlog row.
func runLocalTx(ctx context.Context, e *Env) *Workload {
	o := e.Opt
	w := &Workload{Name: "localtx", Params: map[string]string{
		"concurrency": fmt.Sprint(o.Concurrency), "payload": fmt.Sprint(o.Payload),
		"round": roundDesc(o), "rounds": fmt.Sprint(o.Rounds),
	}}
	fail := func(err error) *Workload { w.Error = err.Error(); return w }
	rawTable, txTable, logTable := e.Names.Name("orders_rawl"), e.Names.Name("orders_rmqtxl"), e.Names.Name("orders_rawll")
	for _, t := range []string{rawTable, txTable, logTable} {
		if err := e.businessTable(ctx, t); err != nil {
			return fail(err)
		}
	}
	handLog := e.Names.Name("handlog_l")
	if err := e.handLogTable(ctx, handLog); err != nil {
		return fail(err)
	}
	store, err := newTxlog(ctx, e)
	if err != nil {
		return fail(err)
	}
	group, topic := e.Names.Name("lg"), e.Names.Name("lt")
	payloadSize, noPayload := o.Payload, o.NoPayload

	raw := &loopSide{side: &Side{Name: "raw local tx (no broker)", Unit: "tx/s", Description: "BEGIN; business INSERT; COMMIT"}, table: rawTable}
	rawInsert := e.insertOrderSQL(rawTable)
	raw.op = raw.counted(func(ctx context.Context, _ int, seq int64) error {
		payload := makePayload(payloadSize, seq)
		tx, err := e.DB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, rawInsert, wire.NewEventID(), int64(len(payload)), payload); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})

	hand := &loopSide{side: &Side{Name: "raw + hand-written log (no broker)", Unit: "tx/s", Description: "BEGIN; INSERT into a hand-written log (id, topic, state, payload); business INSERT; COMMIT"}, table: logTable}
	logInsert := e.handLogInsertSQL(handLog)
	handInsert := e.insertOrderSQL(logTable)
	hand.op = hand.counted(func(ctx context.Context, _ int, seq int64) error {
		id := wire.NewEventID()
		payload := makePayload(payloadSize, seq)
		tx, err := e.DB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, logInsert, id, topic, payload); err != nil {
			_ = tx.Rollback()
			return err
		}
		if _, err := tx.ExecContext(ctx, handInsert, id, int64(len(payload)), payload); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	})

	tx := &loopSide{side: &Side{Name: "rmqtx local tx (no broker)", Unit: "tx/s", Description: "BEGIN; txlog.Store.Insert (the row txproducer writes, payload stored); business INSERT; COMMIT"}, table: txTable}
	txInsert := e.insertOrderSQL(txTable)
	tx.op = tx.counted(func(ctx context.Context, _ int, seq int64) error {
		id := wire.NewEventID()
		payload := makePayload(payloadSize, seq)
		props := wire.Envelope{EventID: id, EventType: benchEventType}.Properties(payload)
		propJSON, _ := json.Marshal(props)
		t, err := e.DB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		row := txlog.Row{
			EventID: id, ProducerGroup: group, Topic: topic, Tags: benchEventType, Keys: id, EventType: benchEventType,
			State: txlog.StateCommitted, Payload: payload, PayloadHash: props[wire.PropPayloadHash],
			Properties: string(propJSON), ResolvedBy: txlog.ByLocalCommit,
		}
		if noPayload {
			row.Payload = nil
		}
		if err := store.Insert(ctx, t, row); err != nil {
			_ = t.Rollback()
			return err
		}
		if _, err := t.ExecContext(ctx, txInsert, id, int64(len(payload)), payload); err != nil {
			_ = t.Rollback()
			return err
		}
		return t.Commit()
	})
	w.Sides = []*Side{raw.side, hand.side, tx.side}
	measureLoops(ctx, e, w, []*loopSide{raw, hand, tx})
	w.Notes = append(w.Notes, "diagnostic for the producer ratio: the same local transactions without the broker")
	return w
}
