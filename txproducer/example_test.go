package txproducer_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

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
		NameServer:   []string{"127.0.0.1:9876"},
		Group:        "shop-orders-tx",
		DB:           db,
		WarmupTopics: []string{"orders"},
	})
	if err != nil {
		return
	}
	if err := p.Log().Migrate(ctx); err != nil {
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
		fmt.Println("committed", res.EventID)
	case txproducer.IsRetryable(err):
		// Broker or database trouble; nothing committed (or, for
		// ErrCommitUnknown, retry with res.EventID to learn the outcome).
		time.Sleep(time.Second)
	case errors.Is(err, txproducer.ErrLocalTx):
		fmt.Println("business rule refused:", err)
	}
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
