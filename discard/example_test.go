package discard_test

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/txlog"
)

// A Recovery runs beside a producer group (txproducer starts one for you
// unless Config.DisableRecovery is set): Start subscribes to the broker's
// discard topic in the background, Close hands back what is undecided.
func Example() {
	db, _ := sqlx.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/app?parseTime=true")
	store, _ := txlog.New(db, txlog.DefaultPrefix)
	r, err := discard.New(discard.Config{
		NameServers: []string{"127.0.0.1:9876"},
		Group:       "orders-tx",
		Log:         store,
	})
	if err != nil {
		return
	}
	if err := r.Start(context.Background()); err != nil {
		return
	}
	defer r.Close()
}

// Handle decides one discarded half from the txlog row: the half that
// committed the row is published again, any other half of the same event
// id is dropped.
func ExampleRecovery_Handle() {
	body := []byte(`{"order":42}`)
	log := newFakeLog()                                 // in a service: txlog.New(db, txlog.DefaultPrefix)
	log.rows["e1"] = committedRow("e1", "orders", body) // committed by half u1
	r, _ := discard.New(discard.Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g", Log: log, Publisher: &fakePublisher{}})
	defer r.Close()

	res, _ := r.Handle(context.Background(), discardedHalf("g", "e1", "u2", body))
	fmt.Println(res.HalfKey, res.Decision)
	res, _ = r.Handle(context.Background(), discardedHalf("g", "e1", "u1", body))
	fmt.Println(res.HalfKey, res.Decision)
	// Output:
	// u2 DROPPED
	// u1 REPUBLISHED
}
