package txproducer_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txproducer"
)

// Publish OrderPlaced if, and only if, the order row commits.
func Example() {
	ctx := context.Background()
	db, err := sqlx.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop?parseTime=true")
	if err != nil {
		return
	}
	p, err := txproducer.New(txproducer.Config{
		NameServers:  []string{"127.0.0.1:9876"},
		Group:        "shop-orders-tx",
		DB:           db,
		WarmupTopics: []string{"orders"},
	})
	if err != nil {
		return
	}
	// Once per deploy (or `rmqtx migrate`): every rmqtx table, one plan.
	if err := schema.MigrateAll(ctx, db, ""); err != nil {
		return
	}
	if err := p.Start(ctx); err != nil {
		return
	}
	defer p.Close()

	res, err := p.Send(ctx, txproducer.Message{
		Topic:       "orders",
		Tags:        "placed",
		EventType:   "OrderPlaced",
		BusinessKey: "order-42",
		Payload:     []byte(`{"order":42,"amount":1999}`),
	}, func(ctx context.Context, tx *sqlx.Tx) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO orders (id, amount) VALUES (?, ?)", 42, 1999)
		return err
	})
	switch {
	case err == nil:
		fmt.Println("committed", res.EventID, "duplicate:", res.Duplicate)
	case errors.Is(err, txproducer.ErrLocalTx):
		fmt.Println("business rule refused:", err)
	default:
		// RetryAdvice says which retry is safe (see ExampleRetryAdvice).
		fmt.Println(txproducer.RetryAdvice(err))
	}
}

// RetryAdvice says which retry is safe after a failed Send. A failure does
// not spend the event id: a retry with the same id either learns that the
// event committed (Duplicate, no second copy published) or commits it, and
// every earlier half of the id is rolled back. An id committed with another
// payload is not retried. Whether to run the caller's refused function again
// is the caller's call (IsRetryable says false for it).
func ExampleRetryAdvice() {
	for _, err := range []error{
		fmt.Errorf("send: %w", txproducer.ErrCommitUnknown),
		fmt.Errorf("send: %w", txproducer.ErrDatabase),
		fmt.Errorf("send: %w", txproducer.ErrSend),
		fmt.Errorf("send: %w", txproducer.ErrFenced),
		fmt.Errorf("%w: card declined", txproducer.ErrLocalTx),
		fmt.Errorf("send: %w", txproducer.ErrEventIDConflict),
	} {
		fmt.Printf("%-58s -> %s\n", err, txproducer.RetryAdvice(err))
	}
	// Output:
	// send: txproducer: commit outcome unknown                   -> retry with the same event id
	// send: txproducer: database                                 -> retry with the same event id
	// send: txproducer: send half message                        -> retry with the same event id
	// send: txproducer: event id already rolled back             -> retry with the same event id
	// txproducer: local transaction failed: card declined        -> retry with the same event id
	// send: txproducer: event id committed with a different payload -> do not retry
}

// A retry loop that follows the advice: the event id derived from the
// business key is sent again until it commits or the failure is final.
func ExampleRetryAdvice_loop() {
	send := func(id string) (txproducer.Result, error) { // stands in for p.Send
		if id == "" {
			return txproducer.Result{EventID: "id-1", State: txproducer.StateUnknown}, txproducer.ErrCommitUnknown
		}
		return txproducer.Result{EventID: id, State: txproducer.StateCommitted, Duplicate: true}, nil
	}
	id := ""
	for attempt := 1; attempt <= 3; attempt++ {
		res, err := send(id)
		if err == nil {
			fmt.Println("committed", res.EventID, "duplicate:", res.Duplicate)
			return
		}
		switch txproducer.RetryAdvice(err) {
		case txproducer.RetryWithSameID:
			id = res.EventID
		default:
			fmt.Println("giving up:", err)
			return
		}
		time.Sleep(10 * time.Millisecond) // back off
	}
	// Output:
	// committed id-1 duplicate: true
}

// Invalid messages fail fast with typed errors, before anything is sent.
func ExampleIsRetryable() {
	err := fmt.Errorf("wrapped: %w", txproducer.ErrPayloadTooLarge)
	fmt.Println(txproducer.IsRetryable(err), errors.Is(err, txproducer.ErrPayloadTooLarge))
	fmt.Println(txproducer.IsRetryable(txproducer.ErrSend))
	// Output:
	// false true
	// true
}
