package archive_test

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/archive"
)

// Count, then remove, terminal rows past the default retentions.
func Example() {
	ctx := context.Background()
	db, err := sqlx.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop?parseTime=true")
	if err != nil {
		return
	}
	a, err := archive.New(archive.Config{DB: db, Move: true})
	if err != nil {
		return
	}
	plan, err := a.Plan(ctx)
	if err != nil {
		return
	}
	for _, r := range plan.Rules {
		fmt.Println(r.Table, r.Rule, r.Eligible)
	}
	rep, err := a.Run(ctx)
	fmt.Println(rep.Removed(), err)
}
