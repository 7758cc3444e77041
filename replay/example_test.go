package replay_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/schema"
)

// Replay yesterday's dead letters of one group, five per second, once the
// handler is fixed.
func Example() {
	ctx := context.Background()
	db, err := sqlx.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop?parseTime=true")
	if err != nil {
		return
	}
	// Once per deploy: every rmqtx table, the audit tables included.
	if err := schema.MigrateAll(ctx, db, ""); err != nil {
		return
	}
	r, err := replay.New(replay.Config{DB: db, NameServers: []string{"127.0.0.1:9876"}, Rate: 5, Batch: 10})
	if err != nil {
		return
	}
	sel := replay.Selector{ConsumerGroup: "points", Since: time.Now().Add(-24 * time.Hour)}
	plan, err := r.DryRun(ctx, sel)
	if err != nil {
		return
	}
	fmt.Println("would replay", plan.Replay, "skip", plan.Skip)
	if err := r.Start(ctx); err != nil {
		return
	}
	defer r.Close()
	rep, err := r.Replay(ctx, replay.Request{Selector: sel, Operator: "alice", Reason: "points handler fixed (INC-7)"})
	if err != nil {
		return
	}
	fmt.Println(rep.AuditID, rep.Result, rep.Sent)
}
