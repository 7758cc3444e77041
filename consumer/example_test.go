package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/errclass"
)

type paymentSucceeded struct {
	OrderID string `json:"order_id"`
	Amount  int64  `json:"amount"`
}

// A consumer that marks orders paid, exactly once per event, never moving an
// order backwards, and parking what cannot be decoded.
func Example() {
	db, err := sqlx.Open("mysql", "rmqtx:rmqtx@tcp(127.0.0.1:3307)/shop?parseTime=true")
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	// The tables exist: schema.MigrateAll(ctx, db, "") (or `rmqtx migrate`)
	// ran at deploy time.
	c, err := consumer.New(consumer.Config{
		Group: "order-service",
		DB:    db,
		Routes: map[string]consumer.Route{
			"PaymentSucceeded": {
				Validate: func(ev consumer.Event) error {
					var p paymentSucceeded
					return json.Unmarshal(ev.Payload, &p) // unclassified: parked as bad data
				},
				Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
					var p paymentSucceeded
					_ = json.Unmarshal(ev.Payload, &p)
					res, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'PAID' WHERE id = ? AND status = 'NEW'", p.OrderID)
					if err != nil {
						return consumer.Transient(err)
					}
					if n, _ := res.RowsAffected(); n == 0 {
						return consumer.Wait(errors.New("order not created yet"))
					}
					// Recorded in the dedup row, in this transaction.
					return ev.SetResultRef("order:" + p.OrderID)
				},
			},
		},
		VersionMode: consumer.VersionMonotonic,
		Redact:      func([]byte) []byte { return []byte(`{"redacted":true}`) },
		NameServers: []string{"127.0.0.1:9876"},
		Topic:       "payments",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := c.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_ = c.Shutdown(sctx)
	}()
	fmt.Printf("%+v\n", c.Processor().Stats())
}

// Handlers return classified errors; errclass.ClassOf (which replaces
// consumer.ClassOf) tells what happens next. An error nobody classified is
// unknown: retried like a transient one, labelled apart.
func ExampleClassOf() {
	errs := []error{
		consumer.Transient(errors.New("connection reset")),
		consumer.Wait(errors.New("order not created yet")),
		consumer.Permanent(errors.New("amount is negative")),
		consumer.BadData(errors.New("payload is not JSON")),
		errors.New("something nobody classified"),
	}
	for _, err := range errs {
		fmt.Println(errclass.ClassOf(err), consumer.IsRetryable(err))
	}
	// Output:
	// transient true
	// wait true
	// permanent false
	// data false
	// unknown true
}

// Operators list parked messages and resolve them.
func ExampleDeadLetterStore() {
	db, err := sqlx.Open("mysql", "rmqtx:rmqtx@tcp(127.0.0.1:3307)/shop?parseTime=true")
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	store, err := consumer.NewDeadLetterStore(db, "")
	if err != nil {
		fmt.Println(err)
		return
	}
	parked, err := store.List(ctx, consumer.DeadLetterFilter{Status: consumer.DeadLetterParked, Limit: 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range parked {
		fmt.Println(d.ID, d.EventID, d.ErrorClass, d.ErrorText)
		if d.ErrorClass == consumer.ClassConflict {
			_ = store.MarkDiscarded(ctx, d.ID, "producer bug, fixed in v2.3")
		}
	}
}
