package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/outbox"
)

// Write the business change and the event in one transaction, then wake the
// dispatcher once the transaction has committed.
func ExampleEnqueue() {
	ctx := context.Background()
	db := sqlx.MustOpen("mysql", "app:secret@tcp(127.0.0.1:3307)/shop?parseTime=true")
	var d *outbox.Dispatcher // the running dispatcher, see ExampleNewDispatcher

	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'PAID', version = 8 WHERE id = ?", "o-1"); err != nil {
		return
	}
	id, err := outbox.Enqueue(ctx, tx, outbox.Event{
		EventType: "OrderPaid", EventVersion: 1,
		AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 8,
		Destination: "order_events", MessageKey: "o-1",
		Payload: []byte(`{"order":"o-1"}`),
	})
	if err != nil {
		return
	}
	if err := tx.Commit(); err != nil {
		return
	}
	if d != nil {
		d.Notify() // after commit: send now rather than at the next poll
	}
	fmt.Println("enqueued", id)
}

// Run a dispatcher that publishes rows to RocketMQ.
func ExampleNewDispatcher() {
	ctx := context.Background()
	db := sqlx.MustOpen("mysql", "app:secret@tcp(127.0.0.1:3307)/shop?parseTime=true")
	// The table exists: schema.MigrateAll (or `rmqtx migrate`) created it.
	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{"127.0.0.1:9876"}})
	if err != nil {
		return
	}
	defer sink.Close()
	d, err := outbox.NewDispatcher(outbox.Config{DB: db, Sink: sink})
	if err != nil {
		return
	}
	if err := d.Start(ctx); err != nil {
		return
	}
	// ... on the way out: drain the sends in flight.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = d.Shutdown(sctx)
}

// The command outbox: a consumer that must call an external API writes a
// row in its own transaction; a dispatcher with a FuncSink makes the call,
// passing the event id as the idempotency key.
func ExampleFuncSink() {
	sms := outbox.FuncSink(func(ctx context.Context, m *outbox.Message) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1:8080/sms", nil)
		if err != nil {
			return outbox.Permanent(err)
		}
		req.Header.Set("Idempotency-Key", m.IdempotencyKey())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return outbox.Unknown(err) // it may have been sent: resend with the same key
		}
		defer resp.Body.Close()
		return outbox.FromHTTPStatus(resp.StatusCode)
	})
	db := sqlx.MustOpen("mysql", "app:secret@tcp(127.0.0.1:3307)/shop?parseTime=true")
	d, err := outbox.NewDispatcher(outbox.Config{DB: db, TablePrefix: "cmd_", Sink: sms})
	if err != nil {
		return
	}
	_ = d.Start(context.Background())
	defer d.Close()
}

func ExampleClassOf() {
	for _, err := range []error{
		outbox.Permanent(errors.New("topic missing")),
		outbox.Unknown(errors.New("timed out")),
		errors.New("connection refused"),
		outbox.FromHTTPStatus(http.StatusTooManyRequests),
		outbox.FromHTTPStatus(http.StatusBadRequest),
	} {
		fmt.Printf("%s %s\n", outbox.ClassOf(err), outbox.CodeOf(err))
	}
	// Output:
	// permanent permanent
	// unknown unknown
	// transient transient
	// transient http_429
	// permanent http_400
}

func ExampleBackoffCeiling() {
	for n := 0; n < 6; n++ {
		fmt.Print(outbox.BackoffCeiling(n, 500*time.Millisecond, 5*time.Second), " ")
	}
	fmt.Println()
	// Output: 500ms 1s 2s 4s 5s 5s
}
