package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txproducer"
)

// CallbackPath is where the payment gateway posts its callbacks.
const CallbackPath = "/payments/callback"

// maxSendAttempts bounds how often one callback sends its event in place
// (the same event id every time) after a failure that the next attempt may
// not meet: a deadlock or a fenced half. Other failures answer 503 and the
// gateway's retry sends the same id again.
const maxSendAttempts = 5

// Callback is the body the gateway posts, signed with SignatureHeader.
type Callback struct {
	PaymentID    string `json:"payment_id"`
	OrderID      string `json:"order_id"`
	AmountCents  int64  `json:"amount_cents"`
	Currency     string `json:"currency"`
	Status       string `json:"status"`
	GatewayTxnID string `json:"gateway_txn_id"`
	PaidAt       string `json:"paid_at"` // RFC 3339, set by the gateway
}

// CallbackResponse is the JSON body of every callback answer.
type CallbackResponse struct {
	Result    string `json:"result,omitempty"` // applied | duplicate
	PaymentID string `json:"payment_id,omitempty"`
	EventID   string `json:"event_id,omitempty"`
	Code      string `json:"code,omitempty"` // machine-readable error code
	Error     string `json:"error,omitempty"`
}

// Sender is the part of txproducer.Producer the callback needs.
type Sender interface {
	Send(ctx context.Context, msg txproducer.Message, fn txproducer.LocalTxFunc) (txproducer.Result, error)
}

// ServiceStats counts callback outcomes.
type ServiceStats struct {
	Callbacks   atomic.Int64 // requests received
	Applied     atomic.Int64 // payments moved to SUCCESS
	Duplicates  atomic.Int64 // repeated callbacks answered as no-ops
	Rejected    atomic.Int64 // 4xx answers
	Unavailable atomic.Int64 // 503 answers (producer restarting, broker or DB trouble)
	Resent      atomic.Int64 // Sends repeated in place with the same event id (deadlock, fenced half)
}

// Service is the payment service (callback endpoint) and the order service
// (create and cancel orders) of the example. Both own tables in one
// database; each publishes through its own path:
//   - PaymentSucceeded: the transactional producer, in the callback's local
//     transaction;
//   - OrderPaid: the payment service's outbox, in the same transaction;
//   - OrderCreated, OrderCanceled: the order service's outbox.
type Service struct {
	DB           *sqlx.DB
	Secret       []byte
	PaymentTopic string
	OrderTopic   string
	PayOutbox    outbox.Table // OrderPaid
	OrderOutbox  outbox.Table // OrderCreated, OrderCanceled
	Log          logrus.FieldLogger
	Now          func() time.Time
	// NotifyPay and NotifyOrder wake the outbox dispatchers after a commit.
	NotifyPay, NotifyOrder func()

	Stats ServiceStats

	mu       sync.RWMutex
	producer Sender // nil while the producer restarts
}

// SetProducer installs (or, with nil, removes) the transactional producer.
// While it is nil the callback answers 503 and the gateway retries.
func (s *Service) SetProducer(p Sender) {
	s.mu.Lock()
	s.producer = p
	s.mu.Unlock()
}

func (s *Service) sender() Sender {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.producer
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

// Handler returns the HTTP handler of the service.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+CallbackPath, s.handleCallback)
	return mux
}

type order struct {
	ID          string `db:"id"`
	UserID      int64  `db:"user_id"`
	AmountCents int64  `db:"amount_cents"`
	Currency    string `db:"currency"`
	Status      string `db:"status"`
	Version     int    `db:"version"`
}

func (o order) snapshot() OrderSnapshot {
	return OrderSnapshot{OrderID: o.ID, UserID: o.UserID, AmountCents: o.AmountCents, Currency: o.Currency, Status: o.Status, Version: o.Version}
}

type payment struct {
	ID           string         `db:"id"`
	OrderID      string         `db:"order_id"`
	UserID       int64          `db:"user_id"`
	AmountCents  int64          `db:"amount_cents"`
	Currency     string         `db:"currency"`
	Status       string         `db:"status"`
	GatewayTxnID sql.NullString `db:"gateway_txn_id"`
	EventID      sql.NullString `db:"event_id"`
}

// CreateOrder is the order service: it creates an order and its pending
// payment and enqueues OrderCreated (v1) in the same transaction.
func (s *Service) CreateOrder(ctx context.Context, orderID, paymentID string, userID, amountCents int64, currency string) error {
	now := s.now()
	o := order{ID: orderID, UserID: userID, AmountCents: amountCents, Currency: currency, Status: OrderCreated, Version: VersionCreated}
	err := inTx(ctx, s.DB, func(tx *sqlx.Tx) error {
		if _, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO orders (id, user_id, amount_cents, currency, status, version, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`), o.ID, o.UserID, o.AmountCents, o.Currency, o.Status, o.Version, now, now); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO payments (id, order_id, user_id, amount_cents, currency, status, created_at, updated_at)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`), paymentID, orderID, userID, amountCents, currency, PaymentPending, now, now); err != nil {
			return err
		}
		_, err := s.OrderOutbox.Enqueue(ctx, tx, orderEvent(TypeOrderCreated, s.OrderTopic, o))
		return err
	})
	if err != nil {
		return fmt.Errorf("create order %s: %w", orderID, err)
	}
	notify(s.NotifyOrder)
	return nil
}

// errNotCancelable: the order is no longer CREATED (it was paid).
var errNotCancelable = errors.New("order cannot be canceled")

// CancelOrder cancels an unpaid order (conditional update) and enqueues
// OrderCanceled (v3). A paid order is not canceled: errNotCancelable.
func (s *Service) CancelOrder(ctx context.Context, orderID string) error {
	now := s.now()
	err := inTx(ctx, s.DB, func(tx *sqlx.Tx) error {
		var o order
		if err := tx.GetContext(ctx, &o, tx.Rebind(`SELECT id, user_id, amount_cents, currency, status, version FROM orders WHERE id = ? FOR UPDATE`), orderID); err != nil {
			return err
		}
		res, err := tx.ExecContext(ctx, tx.Rebind(`UPDATE payments SET status = ?, updated_at = ? WHERE order_id = ? AND status = ?`),
			PaymentCanceled, now, orderID, PaymentPending)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 || o.Status != OrderCreated {
			return errNotCancelable
		}
		o.Status, o.Version = OrderCanceled, VersionCanceled
		if _, err := tx.ExecContext(ctx, tx.Rebind(`UPDATE orders SET status = ?, version = ?, updated_at = ? WHERE id = ?`),
			o.Status, o.Version, now, o.ID); err != nil {
			return err
		}
		_, err = s.OrderOutbox.Enqueue(ctx, tx, orderEvent(TypeOrderCanceled, s.OrderTopic, o))
		return err
	})
	if err != nil {
		return fmt.Errorf("cancel order %s: %w", orderID, err)
	}
	notify(s.NotifyOrder)
	return nil
}

func orderEvent(typ, topic string, o order) outbox.Event {
	return outbox.Event{
		EventID:          EventID(typ, o.ID),
		EventType:        typ,
		EventVersion:     1,
		AggregateType:    AggregateOrder,
		AggregateID:      o.ID,
		AggregateVersion: int64(o.Version),
		Destination:      topic,
		MessageKey:       o.ID,
		Payload:          mustJSON(o.snapshot()),
	}
}

func notify(f func()) {
	if f != nil {
		f()
	}
}

// callbackError is an HTTP error answer.
type callbackError struct {
	status int
	code   string
	msg    string
}

func (e *callbackError) Error() string { return e.code + ": " + e.msg }

func reject(status int, code, format string, args ...any) *callbackError {
	return &callbackError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func (s *Service) handleCallback(w http.ResponseWriter, r *http.Request) {
	s.Stats.Callbacks.Add(1)
	resp, err := s.callback(r)
	if err != nil {
		var ce *callbackError
		if !errors.As(err, &ce) {
			ce = reject(http.StatusServiceUnavailable, "unavailable", "%v", err)
		}
		if ce.status >= 500 {
			s.Stats.Unavailable.Add(1)
			w.Header().Set("Retry-After", "1")
			s.Log.WithError(err).Debug("payment callback: try again later")
		} else {
			s.Stats.Rejected.Add(1)
			l := s.Log.WithField("code", ce.code).WithField("status", ce.status)
			if ce.status == http.StatusConflict {
				l.Debug("payment callback refused: " + ce.msg)
			} else {
				l.Info("payment callback rejected: " + ce.msg)
			}
		}
		writeJSON(w, ce.status, CallbackResponse{Code: ce.code, Error: ce.msg})
		return
	}
	if resp.Result == "duplicate" {
		s.Stats.Duplicates.Add(1)
	} else {
		s.Stats.Applied.Add(1)
	}
	writeJSON(w, http.StatusOK, resp)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// callback verifies and applies one callback. Checks happen in this order,
// each before anything is written: signature (401), body (400), gateway
// status (422), payment exists (404), order and amount match (422), payment
// state (200 duplicate, 409 conflict). Only then does the local transaction
// run, which repeats the state check as a conditional update.
func (s *Service) callback(r *http.Request) (CallbackResponse, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		return CallbackResponse{}, reject(http.StatusBadRequest, "bad_body", "cannot read body: %v", err)
	}
	if err := Verify(s.Secret, r.Header.Get(SignatureHeader), body, s.now()); err != nil {
		return CallbackResponse{}, reject(http.StatusUnauthorized, "bad_signature", "%v", err)
	}
	var cb Callback
	if err := json.Unmarshal(body, &cb); err != nil {
		return CallbackResponse{}, reject(http.StatusBadRequest, "bad_body", "body is not valid JSON: %v", err)
	}
	paidAt, perr := time.Parse(time.RFC3339Nano, cb.PaidAt)
	if cb.PaymentID == "" || cb.OrderID == "" || cb.GatewayTxnID == "" || cb.Currency == "" || perr != nil {
		return CallbackResponse{}, reject(http.StatusBadRequest, "bad_body", "payment_id, order_id, currency, gateway_txn_id and paid_at (RFC 3339) are required")
	}
	if cb.Status != PaymentSuccess {
		return CallbackResponse{}, reject(http.StatusUnprocessableEntity, "unsupported_status", "gateway status %q is not handled by this endpoint", cb.Status)
	}
	ctx := r.Context()
	p, err := s.loadPayment(ctx, cb.PaymentID)
	if errors.Is(err, sql.ErrNoRows) {
		return CallbackResponse{}, reject(http.StatusNotFound, "unknown_payment", "payment %q does not exist", cb.PaymentID)
	}
	if err != nil {
		return CallbackResponse{}, err
	}
	if p.OrderID != cb.OrderID {
		return CallbackResponse{}, reject(http.StatusUnprocessableEntity, "order_mismatch", "payment %s belongs to another order", p.ID)
	}
	if p.AmountCents != cb.AmountCents || p.Currency != cb.Currency {
		return CallbackResponse{}, reject(http.StatusUnprocessableEntity, "amount_mismatch",
			"amount %d %s does not match the payment's %d %s", cb.AmountCents, cb.Currency, p.AmountCents, p.Currency)
	}
	if resp, done, err := s.settled(p, cb); done {
		return resp, err
	}

	// The payment is PENDING: publish PaymentSucceeded in the local
	// transaction that marks it paid.
	ev := PaymentSucceeded{PaymentID: p.ID, OrderID: p.OrderID, UserID: p.UserID, AmountCents: p.AmountCents,
		Currency: p.Currency, GatewayTxnID: cb.GatewayTxnID, PaidAt: paidAt.UTC().Format(time.RFC3339Nano)}
	payload := mustJSON(ev)
	// One event id per payment, derived from the payment id: a failed Send
	// commits nothing and does not spend it (txproducer, "Retries"), so
	// every retry, in place or by the gateway, sends the same id, and a
	// retry after a commit whose answer was lost finds it (Duplicate).
	id := paymentEventID(p.ID)
	msg := txproducer.Message{
		Topic: s.PaymentTopic, EventID: id, EventType: TypePaymentSucceeded, EventVersion: 1,
		Keys: []string{p.ID}, BusinessKey: p.ID, Payload: payload,
	}
	for attempt := 1; ; attempt++ {
		prod := s.sender()
		if prod == nil {
			return CallbackResponse{}, reject(http.StatusServiceUnavailable, "producer_restarting", "the event producer is restarting; retry")
		}
		res, err := prod.Send(ctx, msg, func(ctx context.Context, tx *sqlx.Tx) error {
			return s.markPaid(ctx, tx, p, cb, id, paidAt)
		})
		switch {
		case err == nil && res.State == txproducer.StateCommitted:
			if res.Duplicate {
				return CallbackResponse{Result: "duplicate", PaymentID: p.ID, EventID: id}, nil
			}
			notify(s.NotifyPay)
			return CallbackResponse{Result: "applied", PaymentID: p.ID, EventID: id}, nil
		case txproducer.RetryAdvice(err) == txproducer.RetryWithNewID:
			// The id's row records a rollback written by an rmqtx that did
			// not name halves: that row stays final, and no retry of this
			// payment can commit its one id. Not retryable here (a new
			// database per run never holds such a row); a service that
			// upgrades with such rows derives a second id for them.
			return CallbackResponse{}, reject(http.StatusInternalServerError, "event_id_final",
				"payment %s: event id %s was rolled back by an earlier rmqtx and cannot be reused", p.ID, id)
		case attempt < maxSendAttempts && txproducer.RetryAdvice(err) == txproducer.RetryWithSameID &&
			(errors.Is(err, txproducer.ErrFenced) || errors.Is(err, txproducer.ErrLocalTx) && isLockConflict(err)):
			// A check fenced this Send's half, or a deadlock rolled the
			// local transaction back: nothing committed, and sending the
			// same id again right away takes its row over.
			s.Stats.Resent.Add(1)
			s.Log.WithField("payment_id", p.ID).WithField("event_id", id).WithError(err).Debug("send failed; sending the same event id again")
			continue
		case errors.Is(err, txproducer.ErrLocalTx), errors.Is(err, txproducer.ErrEventIDConflict):
			// Lost a race with another callback or a cancel: re-read.
			q, lerr := s.loadPayment(ctx, p.ID)
			if lerr != nil {
				return CallbackResponse{}, lerr
			}
			if resp, done, serr := s.settled(q, cb); done {
				return resp, serr
			}
			return CallbackResponse{}, fmt.Errorf("local transaction failed: %w", err)
		default:
			// Broker or database trouble, or an unknown commit outcome: the
			// gateway retries the callback, and the retry's Send carries
			// the same id (txproducer.RetryAdvice: RetryWithSameID). It
			// takes over the row of a Send that rolled back, and learns
			// from the txlog that one whose answer was lost committed.
			return CallbackResponse{}, fmt.Errorf("publish: %w", err)
		}
	}
}

// paymentEventID is the event id of a payment's PaymentSucceeded: derived
// from the payment id, the same on every retry.
func paymentEventID(paymentID string) string {
	return EventID(TypePaymentSucceeded, paymentID)
}

// settled answers a callback for a payment that is no longer PENDING.
func (s *Service) settled(p payment, cb Callback) (CallbackResponse, bool, error) {
	switch p.Status {
	case PaymentPending:
		return CallbackResponse{}, false, nil
	case PaymentSuccess:
		if p.GatewayTxnID.String != cb.GatewayTxnID {
			return CallbackResponse{}, true, reject(http.StatusConflict, "already_paid",
				"payment %s was already paid by another gateway transaction", p.ID)
		}
		return CallbackResponse{Result: "duplicate", PaymentID: p.ID, EventID: p.EventID.String}, true, nil
	default:
		return CallbackResponse{}, true, reject(http.StatusConflict, "payment_"+strings.ToLower(p.Status),
			"payment %s is %s; its order can no longer be paid", p.ID, p.Status)
	}
}

func (s *Service) loadPayment(ctx context.Context, id string) (payment, error) {
	var p payment
	err := s.DB.GetContext(ctx, &p, s.DB.Rebind(`SELECT id, order_id, user_id, amount_cents, currency, status, gateway_txn_id, event_id FROM payments WHERE id = ?`), id)
	return p, err
}

var (
	errNotPending = errors.New("payment is no longer pending")
	errOrderState = errors.New("order is not in state CREATED")
)

// markPaid is the callback's local transaction (the txlog row is already
// in tx): conditional updates of payment and order, then OrderPaid into the
// payment service's outbox.
func (s *Service) markPaid(ctx context.Context, tx *sqlx.Tx, p payment, cb Callback, eventID string, paidAt time.Time) error {
	now := s.now()
	res, err := tx.ExecContext(ctx, tx.Rebind(`UPDATE payments SET status = ?, gateway_txn_id = ?, event_id = ?, paid_at = ?, updated_at = ?
		WHERE id = ? AND status = ? AND amount_cents = ? AND currency = ?`),
		PaymentSuccess, cb.GatewayTxnID, eventID, paidAt.UTC(), now, p.ID, PaymentPending, cb.AmountCents, cb.Currency)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return errNotPending
	}
	var o order
	if err := tx.GetContext(ctx, &o, tx.Rebind(`SELECT id, user_id, amount_cents, currency, status, version FROM orders WHERE id = ? FOR UPDATE`), p.OrderID); err != nil {
		return err
	}
	if o.Status != OrderCreated {
		return errOrderState
	}
	o.Status, o.Version = OrderPaid, VersionPaid
	if _, err := tx.ExecContext(ctx, tx.Rebind(`UPDATE orders SET status = ?, version = ?, updated_at = ? WHERE id = ?`), o.Status, o.Version, now, o.ID); err != nil {
		return err
	}
	_, err = s.PayOutbox.Enqueue(ctx, tx, orderEvent(TypeOrderPaid, s.OrderTopic, o))
	return err
}

// inTx runs fn in a transaction and commits it. A deadlock, a lock wait
// timeout or a serialization failure rolls back and runs fn again (up to 5
// times): under MySQL's REPEATABLE READ an outbox insert can deadlock with a
// dispatcher's claim (see isLockConflict).
func inTx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	for attempt := 1; ; attempt++ {
		err := func() error {
			tx, err := db.BeginTxx(ctx, nil)
			if err != nil {
				return err
			}
			if err := fn(tx); err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}()
		if err == nil || attempt >= 5 || !isLockConflict(err) {
			return err
		}
	}
}
