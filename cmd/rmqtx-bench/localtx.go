package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

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
	rowTable := e.Names.Name("orders_rawrl")
	for _, t := range []string{rawTable, txTable, logTable, rowTable} {
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
	// A second rmqtx transaction log (same schema and indexes) for the
	// side that writes rmqtx's row by hand.
	handStore, err := newTxlog(ctx, e)
	if err != nil {
		return fail(err)
	}
	group, topic := e.Names.Name("lg"), e.Names.Name("lt")
	payloadSize, noPayload := o.Payload, o.NoPayload

	// localTx is one local transaction of a side: BEGIN; the side's log
	// row (logRow, unless nil); the business INSERT; COMMIT.
	localTx := func(ctx context.Context, insert, id string, payload []byte, logRow func(tx *sqlx.Tx) error) error {
		tx, err := e.DB.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		if logRow != nil {
			if err := logRow(tx); err != nil {
				_ = tx.Rollback()
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, insert, id, int64(len(payload)), payload); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}

	raw := &loopSide{side: &Side{Name: "raw local tx (no broker)", Unit: "tx/s", Description: "BEGIN; business INSERT; COMMIT"}, table: rawTable}
	rawInsert := e.insertOrderSQL(rawTable)
	raw.op = raw.counted(func(ctx context.Context, _ int, seq int64) error {
		return localTx(ctx, rawInsert, wire.NewEventID(), makePayload(payloadSize, seq), nil)
	})

	hand := &loopSide{side: &Side{Name: "raw + hand-written log (no broker)", Unit: "tx/s", Description: "BEGIN; INSERT into a hand-written log (id, topic, state, payload); business INSERT; COMMIT"}, table: logTable}
	logInsert := e.handLogInsertSQL(handLog)
	handInsert := e.insertOrderSQL(logTable)
	hand.op = hand.counted(func(ctx context.Context, _ int, seq int64) error {
		id, payload := wire.NewEventID(), makePayload(payloadSize, seq)
		return localTx(ctx, handInsert, id, payload, func(tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, logInsert, id, topic, payload)
			return err
		})
	})

	// rmqtxRow is the row txproducer writes for a Send of payload.
	rmqtxRow := func(id string, payload []byte) txlog.Row {
		props := wire.Envelope{EventID: id, EventType: benchEventType}.Properties(payload)
		propJSON, _ := json.Marshal(props)
		r := txlog.Row{
			EventID: id, ProducerGroup: group, Topic: topic, Tags: benchEventType, Keys: id, EventType: benchEventType,
			State: txlog.StateCommitted, Payload: payload, PayloadHash: props[wire.PropPayloadHash],
			Properties: string(propJSON), ResolvedBy: txlog.ByLocalCommit,
		}
		if noPayload {
			r.Payload = nil
		}
		return r
	}

	// row writes the row rmqtx writes, with the same columns and values,
	// into a table with rmqtx's schema and indexes, by hand: what the
	// log's row costs apart from the code that writes it.
	row := &loopSide{side: &Side{Name: sideLocalRowByHand, Unit: "tx/s", Description: "BEGIN; INSERT of the row txproducer writes (its 17 columns and values: payload, hash, properties JSON, resolution) by hand into a table with rmqtx's txlog schema and indexes; business INSERT; COMMIT"}, table: rowTable}
	rowLogInsert := e.rawSQL("INSERT INTO " + handStore.Table() + " (event_id, producer_group, topic, tags, msg_keys, event_type, state, payload, payload_hash, " +
		"properties, business_key, created_at, resolved_at, resolved_by, recovered_at, recovery_decision, recovery_note) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
	rowInsert := e.insertOrderSQL(rowTable)
	row.op = row.counted(func(ctx context.Context, _ int, seq int64) error {
		id, payload := wire.NewEventID(), makePayload(payloadSize, seq)
		r, now := rmqtxRow(id, payload), time.Now().UTC()
		return localTx(ctx, rowInsert, id, payload, func(tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, rowLogInsert, r.EventID, r.ProducerGroup, r.Topic, r.Tags, r.Keys, r.EventType, string(r.State), r.Payload,
				r.PayloadHash, r.Properties, r.BusinessKey, now, now, string(r.ResolvedBy), nil, nil, nil)
			return err
		})
	})

	tx := &loopSide{side: &Side{Name: "rmqtx local tx (no broker)", Unit: "tx/s", Description: "BEGIN; txlog.Store.Insert (the row txproducer writes, payload stored); business INSERT; COMMIT"}, table: txTable}
	txInsert := e.insertOrderSQL(txTable)
	tx.op = tx.counted(func(ctx context.Context, _ int, seq int64) error {
		id, payload := wire.NewEventID(), makePayload(payloadSize, seq)
		r := rmqtxRow(id, payload)
		return localTx(ctx, txInsert, id, payload, func(t *sqlx.Tx) error { return store.Insert(ctx, t, r) })
	})
	w.Sides = []*Side{raw.side, hand.side, row.side, tx.side}
	measureLoops(ctx, e, w, []*loopSide{raw, hand, row, tx})
	// The row by hand must be rmqtx's row: the same columns filled the same
	// way in both tables (ids and times aside), and one log row per business
	// row.
	for _, c := range []struct{ log, business string }{{store.Table(), txTable}, {handStore.Table(), rowTable}} {
		logRows, err1 := e.countRows(ctx, c.log)
		businessRows, err2 := e.countRows(ctx, c.business)
		if err := errors.Join(err1, err2); err != nil || logRows != businessRows || logRows == 0 {
			w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: %d rows in %s for %d business rows (error: %v)", logRows, c.log, businessRows, err))
		}
	}
	mine, err1 := e.txlogShape(ctx, store.Table())
	byHand, err2 := e.txlogShape(ctx, handStore.Table())
	if err := errors.Join(err1, err2); err != nil || mine != byHand {
		w.Notes = append(w.Notes, fmt.Sprintf("CHECK FAILED: the row by hand is not rmqtx's row: rmqtx's %s, by hand %s (error: %v)", mine, byHand, err))
	}
	w.Notes = append(w.Notes, "diagnostic for the producer ratio: the same local transactions without the broker")
	return w
}
