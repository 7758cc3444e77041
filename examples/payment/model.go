package main

import (
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
)

// Event types and the fixed aggregate version each order event carries.
const (
	TypePaymentSucceeded = "PaymentSucceeded"
	TypeOrderCreated     = "OrderCreated"
	TypeOrderPaid        = "OrderPaid"
	TypeOrderCanceled    = "OrderCanceled"
	TypeSendSMS          = "SendSMS"

	VersionCreated  = 1
	VersionPaid     = 2
	VersionCanceled = 3

	AggregateOrder = "order"
)

// Order and payment states.
const (
	OrderCreated  = "CREATED"
	OrderPaid     = "PAID"
	OrderCanceled = "CANCELED"

	PaymentPending  = "PENDING"
	PaymentSuccess  = "SUCCESS"
	PaymentCanceled = "CANCELED"
)

// idNamespace makes derived event ids: UUIDv5(namespace, "<type>/<key>").
var idNamespace = uuid.MustParse("6f1c2a8e-4b8e-4f0e-9d55-7a0b5d6c3e21")

// EventID derives a stable event id from a business key: the same payment
// (or order) always gives the same id, across callback retries, producer
// restarts and re-deliveries, so every consumer's dedup sees one event.
func EventID(eventType, key string) string {
	return uuid.NewSHA1(idNamespace, []byte(eventType+"/"+key)).String()
}

// PaymentSucceeded is the payload of the event the callback publishes.
type PaymentSucceeded struct {
	PaymentID    string `json:"payment_id"`
	OrderID      string `json:"order_id"`
	UserID       int64  `json:"user_id"`
	AmountCents  int64  `json:"amount_cents"`
	Currency     string `json:"currency"`
	GatewayTxnID string `json:"gateway_txn_id"`
	PaidAt       string `json:"paid_at"`
}

func (p PaymentSucceeded) validate() error {
	if p.PaymentID == "" || p.OrderID == "" || p.UserID <= 0 || p.AmountCents <= 0 {
		return fmt.Errorf("payment event incomplete: %+v", p)
	}
	return nil
}

// OrderSnapshot is the payload of every order event: the whole order as of
// its version, so a projection can apply the newest event it sees even
// when older ones arrive later (they are then skipped as stale).
type OrderSnapshot struct {
	OrderID     string `json:"order_id"`
	UserID      int64  `json:"user_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
	Version     int    `json:"version"`
}

func (o OrderSnapshot) validate() error {
	if o.OrderID == "" || o.UserID <= 0 || o.Status == "" || o.Version <= 0 {
		return fmt.Errorf("order event incomplete: %+v", o)
	}
	return nil
}

// SMSCommand is the command-outbox payload of one SMS.
type SMSCommand struct {
	UserID    int64  `json:"user_id"`
	PaymentID string `json:"payment_id"`
	Phone     string `json:"phone"`
	Body      string `json:"body"`
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain structs of strings and numbers are marshalled here.
		panic(err)
	}
	return b
}
