package checkback_test

import (
	"context"
	"fmt"
	"time"

	"github.com/rmqtx/rmqtx/checkback"
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
