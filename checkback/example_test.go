package checkback_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/txlog"
)

// A Checker answers from the txlog: here a transaction with no row, older
// than the fence age, is fenced and rolled back.
func ExampleChecker_CheckQuery() {
	log := newFakeLog() // in a service: txlog.New(db, txlog.DefaultPrefix)
	c, _ := checkback.New(checkback.Config{Log: log, Group: "orders-tx", FenceAge: time.Minute})
	a := c.CheckQuery(context.Background(), checkback.Query{EventID: "e1", BornAt: time.Now().Add(-2 * time.Minute)})
	fmt.Println(a.Decision, a.Reason)
	a = c.CheckQuery(context.Background(), checkback.Query{EventID: "e2", BornAt: time.Now()})
	fmt.Println(a.Decision, a.Reason)
	// Output:
	// rollback fenced
	// unknown young
}

// Recovery runs beside a producer group (txproducer starts one for you).
func ExampleRecovery() {
	db, _ := sqlx.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/app?parseTime=true")
	store, _ := txlog.New(db, txlog.DefaultPrefix)
	r, err := checkback.NewRecovery(checkback.RecoveryConfig{
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
