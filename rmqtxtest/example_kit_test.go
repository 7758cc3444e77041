package rmqtxtest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/rmqtxtest"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The examples of the kit constructors. Those that need a database show a
// test function and have no "Output:" line: go test compiles them but does
// not run them (rmqtx's own tests of the same code are in handler_test.go).
// ExampleNewSink needs no database and runs.

// openTestDB stands in for the user's own helper that opens a fresh test
// database with rmqtx's tables (schema.MigrateAll) and the business tables.
// The examples that call it are compiled, never run.
var openTestDB func(t testing.TB) *sqlx.DB

// A producer test: the local transaction's write and the event go together,
// and the event is on the topic once Send returns.
func ExampleNewProducer() {
	testOrderPlaced := func(t *testing.T) {
		db := openTestDB(t)
		b := rmqtxtest.NewBroker(t)
		p := rmqtxtest.NewProducer(t, b, txproducer.Config{Group: "orders", DB: db})

		res, err := p.Send(context.Background(), txproducer.Message{
			Topic: "orders", EventType: "OrderPlaced",
			AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 1,
			Payload: []byte(`{"order":"o-1"}`),
		}, func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO orders (id) VALUES (?)"), "o-1")
			return err
		})
		if err != nil || res.State != txproducer.StateCommitted {
			t.Fatalf("send: %v (%s)", err, res.State)
		}
		if got := b.Messages("orders"); len(got) != 1 || got[0].MsgID != res.MsgID {
			t.Fatalf("want the committed event on the topic, got %d messages", len(got))
		}
	}
	_ = testOrderPlaced
}

// A consumer test: the broker delivers the event twice, the handler's effect
// is there once. This is the test of the README's "Testing your code"; the
// same code runs in rmqtx's own suite as creditAppliedOnce (handler_test.go).
func ExampleNewConsumer() {
	testCreditAppliedOnce := func(t *testing.T) {
		db := openTestDB(t)
		creditAppliedOnce(t, db)
	}
	_ = testCreditAppliedOnce
}

// An outbox test: the row enqueued in the business transaction is sent by
// the dispatcher (through a sink on b) and lands on the topic.
func ExampleNewDispatcher() {
	testOutbox := func(t *testing.T) {
		ctx := context.Background()
		db := openTestDB(t)
		b := rmqtxtest.NewBroker(t)
		d := rmqtxtest.NewDispatcher(t, b, outbox.Config{DB: db})

		tx := db.MustBeginTx(ctx, nil)
		if _, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "OrderPlaced",
			Destination: "orders", Payload: []byte(`{"order":"o-1"}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		d.Notify()
		if _, err := b.WaitMessages(ctx, "orders", 1); err != nil {
			t.Fatal(err)
		}
	}
	_ = testOutbox
}

// The outbox's RocketMQ sink on the kit's broker, no database needed: what
// the sink sends is what the broker stores, in rmqtx's wire format.
func ExampleNewSink() {
	t := newExampleT() // an Example has no *testing.T; in a test, pass t
	defer t.done()
	b := rmqtxtest.NewBroker(t)
	sink := rmqtxtest.NewSink(t, b, outbox.RocketMQConfig{})

	err := sink.Send(context.Background(), &outbox.Message{Attempt: 1, Event: outbox.Event{
		EventID: "evt-1", EventType: "OrderPlaced", Destination: "orders",
		AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 1,
		MessageKey: "o-1", Payload: []byte(`{"order":"o-1"}`),
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range b.Messages("orders") {
		fmt.Println(m.Topic, m.Tags, m.Keys, string(m.Body), m.Properties["RMQTX_EVENT_ID"])
	}
	// Output:
	// orders OrderPlaced [o-1 evt-1] {"order":"o-1"} evt-1
}

// exampleT is the testing.TB of a runnable Example, which gets none: it
// fails by printing (the Output check then fails) and runs the cleanups at
// done. Embedding testing.TB (nil) gives it the interface's unexported
// method; every method the kit calls is defined here.
type exampleT struct {
	testing.TB
	cleanups []func()
	failed   bool
}

func newExampleT() *exampleT { return &exampleT{} }

func (t *exampleT) Helper()                   {}
func (t *exampleT) Name() string              { return "Example" }
func (t *exampleT) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Failed() bool              { return t.failed }
func (t *exampleT) Logf(string, ...any)       {}
func (t *exampleT) Log(...any)                {}
func (t *exampleT) Errorf(f string, a ...any) { t.failed = true; fmt.Printf(f+"\n", a...) }
func (t *exampleT) Error(a ...any)            { t.failed = true; fmt.Println(a...) }
func (t *exampleT) Fatalf(f string, a ...any) {
	t.Errorf(f, a...)
	t.done()
	panic("example failed") // an Example cannot stop itself otherwise
}

// done runs the cleanups, last registered first, as testing does.
func (t *exampleT) done() {
	for len(t.cleanups) > 0 {
		f := t.cleanups[len(t.cleanups)-1]
		t.cleanups = t.cleanups[:len(t.cleanups)-1]
		f()
	}
}
