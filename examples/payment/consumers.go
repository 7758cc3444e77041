package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/outbox"
)

// errInjected is the failure the demo injects into handlers.
var errInjected = errors.New("injected failure (demo)")

// Injector fails the first attempt of a deterministic share of events, per
// consumer group, with a transient error: the consumer rolls back, the
// broker redelivers, the second attempt succeeds.
type Injector struct {
	Rate float64 // share of events whose first attempt fails, 0..1

	seen     sync.Map // group + "/" + event id -> struct{}
	Injected atomic.Int64
}

// pick reports whether key falls in the share rate (stable per key).
func pick(key string, rate float64) bool {
	if rate <= 0 {
		return false
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return float64(h.Sum64()%10000) < rate*10000
}

// Fail returns a transient error the first time (group, id) is picked.
func (in *Injector) Fail(group, id string) error {
	if in == nil || !pick(group+"/"+id, in.Rate) {
		return nil
	}
	if _, loaded := in.seen.LoadOrStore(group+"/"+id, struct{}{}); loaded {
		return nil
	}
	in.Injected.Add(1)
	return consumer.Transient(fmt.Errorf("%w: group %s event %s", errInjected, group, id))
}

// Handlers holds the three consumers' business logic.
type Handlers struct {
	Inject    *Injector
	SMSOutbox outbox.Table
	// NotifySMS wakes the SMS dispatcher (best effort: the row commits
	// after the handler returns, so the next poll may be the one that sees it).
	NotifySMS func()
	Now       func() time.Time
}

func (h *Handlers) now() time.Time {
	if h.Now != nil {
		return h.Now().UTC()
	}
	return time.Now().UTC()
}

func decodePayment(ev consumer.Event) (PaymentSucceeded, error) {
	var p PaymentSucceeded
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		return p, consumer.BadData(fmt.Errorf("PaymentSucceeded %s: %w", ev.ID, err))
	}
	if err := p.validate(); err != nil {
		return p, consumer.BadData(err)
	}
	return p, nil
}

func decodeOrder(ev consumer.Event) (OrderSnapshot, error) {
	var o OrderSnapshot
	if err := json.Unmarshal(ev.Payload, &o); err != nil {
		return o, consumer.BadData(fmt.Errorf("%s %s: %w", ev.Type, ev.ID, err))
	}
	if err := o.validate(); err != nil {
		return o, consumer.BadData(err)
	}
	if int64(o.Version) != ev.AggregateVersion || ev.AggregateID != o.OrderID {
		return o, consumer.BadData(fmt.Errorf("%s %s: envelope says %s v%d, payload %s v%d",
			ev.Type, ev.ID, ev.AggregateID, ev.AggregateVersion, o.OrderID, o.Version))
	}
	return o, nil
}

// PointsFor is the loyalty rule: one point per whole currency unit.
func PointsFor(amountCents int64) int64 { return amountCents / 100 }

// PointsRoutes credits points for PaymentSucceeded, once per payment: the
// consume log row and the ledger row commit together.
func (h *Handlers) PointsRoutes(group string) map[string]consumer.Route {
	return map[string]consumer.Route{
		TypePaymentSucceeded: {
			Validate: func(ev consumer.Event) error { _, err := decodePayment(ev); return err },
			Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
				if err := h.Inject.Fail(group, ev.ID); err != nil {
					return err
				}
				p, err := decodePayment(ev)
				if err != nil {
					return err
				}
				now := h.now()
				pts := PointsFor(p.AmountCents)
				id, err := insertLedger(ctx, tx, p.PaymentID, ev.ID, p.UserID, pts, now)
				if err != nil {
					return consumer.Transient(err)
				}
				if _, err := tx.ExecContext(ctx, tx.Rebind(sqlFor(tx.DriverName()).addPoints), p.UserID, pts, now); err != nil {
					return consumer.Transient(err)
				}
				return ev.SetResultRef(fmt.Sprintf("points_ledger:%d", id))
			},
		},
	}
}

// NotificationRoutes queues the "payment received" SMS for PaymentSucceeded:
// a notifications row and a command-outbox row in the consumer's
// transaction. The SMS itself is sent later by the outbox dispatcher, with
// the event id as the idempotency key, and throttled per user there.
func (h *Handlers) NotificationRoutes(group string) map[string]consumer.Route {
	return map[string]consumer.Route{
		TypePaymentSucceeded: {
			Validate: func(ev consumer.Event) error { _, err := decodePayment(ev); return err },
			Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
				if err := h.Inject.Fail(group, ev.ID); err != nil {
					return err
				}
				p, err := decodePayment(ev)
				if err != nil {
					return err
				}
				var phone string
				if err := tx.GetContext(ctx, &phone, tx.Rebind(`SELECT phone FROM users WHERE id = ?`), p.UserID); err != nil {
					return consumer.Transient(fmt.Errorf("user %d: %w", p.UserID, err))
				}
				body := fmt.Sprintf("Payment of %d.%02d %s for order %s received. Thank you!",
					p.AmountCents/100, p.AmountCents%100, p.Currency, shortID(p.OrderID))
				if _, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO notifications (event_id, payment_id, user_id, phone, body, created_at) VALUES (?, ?, ?, ?, ?, ?)`),
					ev.ID, p.PaymentID, p.UserID, phone, body, h.now()); err != nil {
					return consumer.Transient(err)
				}
				if _, err := h.SMSOutbox.Enqueue(ctx, tx, outbox.Event{
					EventID:     ev.ID, // the idempotency key the gateway sees
					EventType:   TypeSendSMS,
					Destination: "sms",
					MessageKey:  p.PaymentID,
					Payload:     mustJSON(SMSCommand{UserID: p.UserID, PaymentID: p.PaymentID, Phone: phone, Body: body}),
				}); err != nil {
					return consumer.Transient(err)
				}
				if err := ev.SetResultRef("sms:" + ev.ID); err != nil {
					return err
				}
				notify(h.NotifySMS)
				return nil
			},
		},
	}
}

// SearchRoutes keeps the order_search projection. The routes use the
// monotonic version guard: a newer order version applies, an older one that
// arrives late is skipped as stale, so the view never moves backwards.
func (h *Handlers) SearchRoutes(group string) map[string]consumer.Route {
	apply := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		if err := h.Inject.Fail(group, ev.ID); err != nil {
			return err
		}
		o, err := decodeOrder(ev)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, tx.Rebind(sqlFor(tx.DriverName()).upsertSearch),
			o.OrderID, o.UserID, o.AmountCents, o.Currency, o.Status, o.Version, ev.ID, h.now()); err != nil {
			return consumer.Transient(err)
		}
		return nil
	}
	validate := func(ev consumer.Event) error { _, err := decodeOrder(ev); return err }
	r := consumer.Route{Handler: apply, Validate: validate, Version: consumer.VersionMonotonic}
	return map[string]consumer.Route{TypeOrderCreated: r, TypeOrderPaid: r, TypeOrderCanceled: r}
}

// insertLedger writes the ledger row and returns its id: from the
// driver's last insert id on MySQL, from RETURNING on PostgreSQL (whose
// driver has no last insert id).
func insertLedger(ctx context.Context, tx *sqlx.Tx, paymentID, eventID string, userID, points int64, now time.Time) (int64, error) {
	const insert = `INSERT INTO points_ledger (payment_id, event_id, user_id, points, created_at) VALUES (?, ?, ?, ?, ?)`
	if tx.DriverName() == "pgx" {
		var id int64
		err := tx.QueryRowxContext(ctx, tx.Rebind(insert+` RETURNING id`), paymentID, eventID, userID, points, now).Scan(&id)
		return id, err
	}
	res, err := tx.ExecContext(ctx, insert, paymentID, eventID, userID, points, now)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[len(id)-12:]
	}
	return id
}
