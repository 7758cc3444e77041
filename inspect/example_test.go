package inspect_test

import (
	"context"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/inspect"
)

// Where is this event? Tables and broker, payloads hidden (sizes only).
func Example() {
	ctx := context.Background()
	db, err := sqlx.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop?parseTime=true")
	if err != nil {
		return
	}
	in, err := inspect.New(inspect.Config{
		DB:     db,
		Broker: inspect.RemotingLookup{NameServers: []string{"127.0.0.1:9876"}},
	})
	if err != nil {
		return
	}
	v, err := in.Event(ctx, "0197a000-0000-7000-8000-000000000001")
	if err != nil {
		return
	}
	for _, c := range v.Consumed {
		fmt.Println(c.ConsumerGroup, c.Status)
	}
	for _, m := range v.Broker {
		fmt.Println(m.Kind, m.Topic, m.StoredAt)
	}
}

// The default redactor shows only the size.
func ExampleHidden() {
	fmt.Println(inspect.Hidden()([]byte(`{"card":"4111111111111111"}`)))
	// Output: <27 bytes>
}

// ShowPrefix, an explicit opt-out of full redaction, shows a short prefix
// and the size.
func ExampleShowPrefix() {
	fmt.Println(inspect.ShowPrefix(8)([]byte(`{"card":"4111111111111111"}`)))
	// Output: {"card":… <27 bytes>
}
