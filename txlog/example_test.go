package txlog_test

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
)

// The producer inserts the row first in its local transaction; a check-back
// reads it, or fences a transaction that never ran.
func Example() {
	ctx := context.Background()
	db, err := sqlx.Open("mysql", "user:pass@tcp(127.0.0.1:3306)/app?parseTime=true")
	if err != nil {
		return
	}
	// Once per deploy: every rmqtx table, one plan.
	if err := schema.MigrateAll(ctx, db, txlog.DefaultPrefix); err != nil {
		return
	}
	store, err := txlog.New(db, txlog.DefaultPrefix)
	if err != nil {
		return
	}
	row, err := store.Get(ctx, "0190b6a4-...")
	switch {
	case err == nil:
		fmt.Println("decided:", row.State, "by", row.ResolvedBy)
	default:
		// Old enough and still unknown: fence it, then answer what the row says.
		row, _, err = store.Fence(ctx, txlog.Row{EventID: "0190b6a4-...", ProducerGroup: "orders-tx"})
		if err == nil {
			fmt.Println("answer:", row.State)
		}
	}
}

func ExampleNew() {
	store, err := txlog.New(nil, "bad-prefix")
	fmt.Println(store == nil, err != nil)
	// Output: true true
}
