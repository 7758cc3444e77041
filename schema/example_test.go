package schema_test

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/schema"
)

// A producer-only service migrates the transaction log alone, at start-up
// or at deploy time. Adding the consumer later runs the consumer's steps
// only: the version table records each component's steps.
func ExampleMigrate() {
	ctx := context.Background()
	db, err := sqlx.Open("mysql", "user:pass@tcp(127.0.0.1:3306)/app?parseTime=true")
	if err != nil {
		return
	}
	err = schema.Migrate(ctx, db, schema.Options{
		Prefix:     "", // "" means schema.DefaultPrefix: rmqtx_txlog
		Components: []schema.Component{schema.TxLog},
	})
	if err != nil {
		fmt.Println(err)
	}
}

// A team that applies schema changes with its own tool writes rmqtx's steps
// into that tool's directory (as `rmqtx migrate --print --out DIR` does).
// Existing names the files already there: the new ones come after them.
func ExampleFiles() {
	files, err := schema.Files(schema.FilesOptions{
		Dialect:  "postgres",
		Format:   schema.GolangMigrate,
		Options:  schema.Options{Components: []schema.Component{schema.TxLog, schema.Outbox}},
		Existing: []string{"000001_create_users.up.sql", "000002_add_orders.up.sql"},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range files {
		fmt.Println(f.Name)
	}
	// Output:
	// 000003_rmqtx_txlog_001_create_txlog.up.sql
	// 000004_rmqtx_outbox_001_outbox.up.sql
}
