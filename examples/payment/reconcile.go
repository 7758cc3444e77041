package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/inspect"
)

// Report is the result of a reconciliation: what each side holds, and every
// discrepancy between them.
type Report struct {
	Orders          int
	OrdersCanceled  int
	Payments        int
	Succeeded       int
	Pending         int
	TxlogCommitted  int // COMMITTED PaymentSucceeded rows in the txlog
	PointsRows      int
	PointsTotal     int64
	Notifications   int
	SMSKeys         int // distinct idempotency keys the gateway recorded
	SMSCalls        int // all calls the gateway recorded
	ProjectionRows  int
	ProjectionMatch int // projection rows equal to the order's status and version
	DeadLetters     int // parked consumer dead letters
	OutboxDead      int // DEAD rows in the three outboxes
	OutboxOpen      int // rows not yet SENT in the three outboxes
	Stuck           int // rows `rmqtx stuck` lists (consumes being retried, parked dead letters)

	Discrepancies []Discrepancy
}

// Discrepancy is one failed check with the ids that fail it.
type Discrepancy struct {
	Check string
	IDs   []string
	Count int
}

// OK reports whether no check failed.
func (r Report) OK() bool { return len(r.Discrepancies) == 0 }

// Tables names the rmqtx tables the reconciliation reads.
type Tables struct {
	Txlog      string   // the producer's txlog table
	DeadLetter string   // the consumers' dead-letter table
	Outboxes   []string // the outbox tables
	Groups     []string // the consumer groups of this run (empty: all)
	Prefix     string   // the rmqtx tables' prefix, for the stuck query (default "rmqtx_")
}

// Reconcile compares the payments marked SUCCESS with the points credited,
// the notifications queued and delivered, and the search projection, and
// returns every discrepancy. It only reads.
func Reconcile(ctx context.Context, db *sqlx.DB, t Tables) (Report, error) {
	var r Report
	counts := []struct {
		dst *int
		q   string
	}{
		{&r.Orders, `SELECT COUNT(*) FROM orders`},
		{&r.OrdersCanceled, `SELECT COUNT(*) FROM orders WHERE status = 'CANCELED'`},
		{&r.Payments, `SELECT COUNT(*) FROM payments`},
		{&r.Succeeded, `SELECT COUNT(*) FROM payments WHERE status = 'SUCCESS'`},
		{&r.Pending, `SELECT COUNT(*) FROM payments WHERE status = 'PENDING'`},
		{&r.PointsRows, `SELECT COUNT(*) FROM points_ledger`},
		{&r.Notifications, `SELECT COUNT(*) FROM notifications`},
		{&r.SMSKeys, `SELECT COUNT(*) FROM sms_gateway_log`},
		{&r.SMSCalls, `SELECT COALESCE(SUM(calls), 0) FROM sms_gateway_log`},
		{&r.ProjectionRows, `SELECT COUNT(*) FROM order_search`},
		{&r.ProjectionMatch, `SELECT COUNT(*) FROM order_search s JOIN orders o ON o.id = s.order_id AND o.status = s.status AND o.version = s.version`},
		{&r.TxlogCommitted, `SELECT COUNT(*) FROM ` + t.Txlog + ` WHERE state = 'COMMITTED' AND event_type = 'PaymentSucceeded'`},
	}
	for _, c := range counts {
		if err := db.GetContext(ctx, c.dst, c.q); err != nil {
			return r, fmt.Errorf("reconcile: %s: %w", c.q, err)
		}
	}
	if err := db.GetContext(ctx, &r.PointsTotal, `SELECT COALESCE(SUM(points), 0) FROM points_ledger`); err != nil {
		return r, fmt.Errorf("reconcile: points: %w", err)
	}
	dlq := `SELECT COUNT(*) FROM ` + t.DeadLetter + ` WHERE status = 'PARKED'`
	var args []any
	if len(t.Groups) > 0 {
		q, a, err := sqlx.In(dlq+` AND consumer_group IN (?)`, t.Groups)
		if err != nil {
			return r, err
		}
		dlq, args = db.Rebind(q), a
	}
	if err := db.GetContext(ctx, &r.DeadLetters, dlq, args...); err != nil {
		return r, fmt.Errorf("reconcile: dead letters: %w", err)
	}
	for _, ob := range t.Outboxes {
		var dead, open int
		if err := db.GetContext(ctx, &dead, `SELECT COUNT(*) FROM `+ob+` WHERE status = 'DEAD'`); err != nil {
			return r, fmt.Errorf("reconcile: %s: %w", ob, err)
		}
		if err := db.GetContext(ctx, &open, `SELECT COUNT(*) FROM `+ob+` WHERE status NOT IN ('SENT', 'DEAD')`); err != nil {
			return r, fmt.Errorf("reconcile: %s: %w", ob, err)
		}
		r.OutboxDead += dead
		r.OutboxOpen += open
	}

	// Each check lists the ids that break it.
	checks := []struct{ name, q string }{
		{"payment SUCCESS but its order is not PAID",
			`SELECT p.id FROM payments p JOIN orders o ON o.id = p.order_id WHERE p.status = 'SUCCESS' AND o.status <> 'PAID'`},
		{"order PAID but its payment is not SUCCESS",
			`SELECT o.id FROM orders o JOIN payments p ON p.order_id = o.id WHERE o.status = 'PAID' AND p.status <> 'SUCCESS'`},
		{"payment SUCCESS without a COMMITTED PaymentSucceeded in the txlog",
			`SELECT p.id FROM payments p LEFT JOIN ` + t.Txlog + ` x ON x.event_id = p.event_id AND x.state = 'COMMITTED' WHERE p.status = 'SUCCESS' AND x.event_id IS NULL`},
		{"payment SUCCESS without points",
			`SELECT p.id FROM payments p LEFT JOIN points_ledger l ON l.payment_id = p.id WHERE p.status = 'SUCCESS' AND l.id IS NULL`},
		{"points credited for a payment that is not SUCCESS",
			`SELECT l.payment_id FROM points_ledger l LEFT JOIN payments p ON p.id = l.payment_id WHERE p.id IS NULL OR p.status <> 'SUCCESS'`},
		{"points credited differ from the amount",
			`SELECT l.payment_id FROM points_ledger l JOIN payments p ON p.id = l.payment_id WHERE l.points <> FLOOR(p.amount_cents / 100) OR l.user_id <> p.user_id`},
		{"points balance differs from the ledger",
			`SELECT u.id FROM users u
			   LEFT JOIN points_balance b ON b.user_id = u.id
			   LEFT JOIN (SELECT user_id, SUM(points) s FROM points_ledger GROUP BY user_id) l ON l.user_id = u.id
			  WHERE COALESCE(b.points, 0) <> COALESCE(l.s, 0)`},
		{"payment SUCCESS without a notification",
			`SELECT p.id FROM payments p LEFT JOIN notifications n ON n.payment_id = p.id WHERE p.status = 'SUCCESS' AND n.event_id IS NULL`},
		{"notification for a payment that is not SUCCESS",
			`SELECT n.payment_id FROM notifications n LEFT JOIN payments p ON p.id = n.payment_id WHERE p.id IS NULL OR p.status <> 'SUCCESS'`},
		{"notification not delivered by the SMS gateway",
			`SELECT n.payment_id FROM notifications n LEFT JOIN sms_gateway_log g ON g.idempotency_key = n.event_id WHERE g.idempotency_key IS NULL`},
		{"SMS delivered without a notification",
			`SELECT g.idempotency_key FROM sms_gateway_log g LEFT JOIN notifications n ON n.event_id = g.idempotency_key WHERE n.event_id IS NULL`},
		{"order missing from the search projection",
			`SELECT o.id FROM orders o LEFT JOIN order_search s ON s.order_id = o.id WHERE s.order_id IS NULL`},
		{"search projection differs from the order (status or version)",
			`SELECT o.id FROM orders o JOIN order_search s ON s.order_id = o.id WHERE s.status <> o.status OR s.version <> o.version`},
		{"search projection row without an order",
			`SELECT s.order_id FROM order_search s LEFT JOIN orders o ON o.id = s.order_id WHERE o.id IS NULL`},
		{"payment still PENDING (neither paid nor canceled)",
			`SELECT p.id FROM payments p WHERE p.status = 'PENDING'`},
	}
	for _, c := range checks {
		var ids []string
		if err := db.SelectContext(ctx, &ids, c.q); err != nil {
			return r, fmt.Errorf("reconcile: %s: %w", c.name, err)
		}
		if len(ids) > 0 {
			d := Discrepancy{Check: c.name, Count: len(ids), IDs: ids}
			if len(ids) > 5 {
				d.IDs = ids[:5]
			}
			r.Discrepancies = append(r.Discrepancies, d)
		}
	}
	if r.DeadLetters > 0 {
		r.Discrepancies = append(r.Discrepancies, Discrepancy{Check: "consumer dead letters parked", Count: r.DeadLetters})
	}
	if r.OutboxDead > 0 {
		r.Discrepancies = append(r.Discrepancies, Discrepancy{Check: "outbox rows DEAD", Count: r.OutboxDead})
	}
	if r.OutboxOpen > 0 {
		r.Discrepancies = append(r.Discrepancies, Discrepancy{Check: "outbox rows not yet sent", Count: r.OutboxOpen})
	}
	stuck, err := stuckRows(ctx, db, t)
	if err != nil {
		return r, err
	}
	r.Stuck = len(stuck)
	if len(stuck) > 0 {
		d := Discrepancy{Check: "unfinished work listed by rmqtx stuck", Count: len(stuck)}
		for _, s := range stuck[:min(5, len(stuck))] {
			d.IDs = append(d.IDs, s.Status+" "+s.Where+"/"+s.EventID)
		}
		r.Discrepancies = append(r.Discrepancies, d)
	}
	return r, nil
}

// stuckRows runs the query behind `rmqtx stuck` (inspect.Inspector.Stuck)
// with no minimum age: once the run is quiescent nothing may be unfinished,
// for instance no attempt row left behind by an event that was applied.
// Consumer rows of other groups are left out when t.Groups is set; tables
// the demo does not have (the default outbox) are skipped by the inspector.
func stuckRows(ctx context.Context, db *sqlx.DB, t Tables) ([]inspect.StuckRow, error) {
	prefix := t.Prefix
	if prefix == "" {
		prefix = rmqtxPrefix
	}
	in, err := inspect.New(inspect.Config{DB: db, TablePrefix: prefix, Redact: inspect.Hidden()})
	if err != nil {
		return nil, fmt.Errorf("reconcile: stuck: %w", err)
	}
	rows, _, err := in.Stuck(ctx, 0, 1000)
	if err != nil {
		return nil, fmt.Errorf("reconcile: stuck: %w", err)
	}
	consumerTables := map[string]bool{prefix + "consume_attempt": true, prefix + "dead_letter": true}
	var out []inspect.StuckRow
	for _, r := range rows {
		if len(t.Groups) > 0 && consumerTables[r.Table] && !slices.Contains(t.Groups, r.Where) {
			continue
		}
		out = append(out, r)
	}
	return out, nil
}

// Print writes the report for humans.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "reconciliation: %d payments SUCCESS | %d txlog COMMITTED | %d points rows | %d notifications | %d SMS keys at the gateway | %d/%d projection rows match | %d stuck\n",
		r.Succeeded, r.TxlogCommitted, r.PointsRows, r.Notifications, r.SMSKeys, r.ProjectionMatch, r.Orders, r.Stuck)
	if r.OK() {
		fmt.Fprintln(w, "reconciliation: OK, 0 discrepancies")
		return
	}
	fmt.Fprintf(w, "reconciliation: FAILED, %d discrepancies\n", len(r.Discrepancies))
	for _, d := range r.Discrepancies {
		ids := ""
		if len(d.IDs) > 0 {
			ids = ": " + strings.Join(d.IDs, ", ")
			if d.Count > len(d.IDs) {
				ids += ", ..."
			}
		}
		fmt.Fprintf(w, "  - %s (%d)%s\n", d.Check, d.Count, ids)
	}
}
