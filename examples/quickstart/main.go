// Command quickstart places an order: one event through the transactional
// producer, one through the outbox, both applied once by a consumer.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"log"
	"time"

	_ "github.com/go-sql-driver/mysql" // driver "mysql": MySQL, MariaDB
	_ "github.com/jackc/pgx/v5/stdlib" // driver "pgx": PostgreSQL
	"github.com/jmoiron/sqlx"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txproducer"
)

func main() {
	pg := flag.Bool("postgres", false, "use the local PostgreSQL (127.0.0.1:5433) instead of the local MariaDB (127.0.0.1:3307)")
	dsn := flag.String("dsn", "", "database DSN, for another database than the local one (PostgreSQL: with -postgres)")
	ns := flag.String("namesrv", "127.0.0.1:9876", "RocketMQ name server")
	flag.Parse()
	driver, local := "mysql", "rmqtx:rmqtx@tcp(127.0.0.1:3307)/rmqtx?parseTime=true"
	if *pg {
		driver, local = "pgx", "postgres://rmqtx:rmqtx@127.0.0.1:5433/rmqtx?sslmode=disable"
	}
	db := sqlx.MustOpen(driver, cmp.Or(*dsn, local)) // panics only for an unknown driver
	if err := run(context.Background(), db, *ns, "rmqtx-quickstart"); err != nil {
		log.Fatalf("quickstart: %v", err)
	}
}

// run places one order on topic and returns once both its events were applied.
func run(ctx context.Context, db *sqlx.DB, nameServer, topic string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ns, order := []string{nameServer}, fmt.Sprintf("order-%d", time.Now().UnixNano())
	if err := schema.MigrateAll(ctx, db, ""); err != nil { // every rmqtx table; idempotent
		return err
	}
	_, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS qs_orders (id VARCHAR(64) PRIMARY KEY, events INT NOT NULL)")
	if err != nil {
		return err
	}
	p, err := txproducer.New(txproducer.Config{NameServers: ns, Group: topic + "-tx", DB: db, WarmupTopics: []string{topic}})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Close()
	count := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		_, err := tx.ExecContext(ctx, tx.Rebind("UPDATE qs_orders SET events = events + 1 WHERE id = ?"), ev.BusinessKey)
		return err
	}
	c, err := consumer.New(consumer.Config{NameServers: ns, Topic: topic, Group: topic + "-counter", DB: db,
		Routes: map[string]consumer.Route{"OrderPlaced": {Handler: count}, "ReceiptRequested": {Handler: count}}})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer c.Close()
	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: ns, Group: topic + "-outbox"})
	if err != nil {
		return err
	}
	defer sink.Close()
	d, err := outbox.NewDispatcher(outbox.Config{DB: db, Sink: sink})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer d.Close()
	// OrderPlaced is published if, and only if, this transaction commits; the
	// outbox row of ReceiptRequested commits with it, and the dispatcher sends it.
	placed, err := p.Send(ctx, txproducer.Message{Topic: topic, EventType: "OrderPlaced", BusinessKey: order, Payload: []byte(`{}`)},
		func(ctx context.Context, tx *sqlx.Tx) (err error) {
			if _, err = tx.ExecContext(ctx, tx.Rebind("INSERT INTO qs_orders (id, events) VALUES (?, 0)"), order); err == nil {
				_, err = outbox.Enqueue(ctx, tx, outbox.Event{EventType: "ReceiptRequested", Destination: topic, MessageKey: order, Payload: []byte(`{}`)})
			}
			return err
		})
	for n := 0; err == nil && n < 2; time.Sleep(20 * time.Millisecond) { // until both were applied
		err = db.GetContext(ctx, &n, db.Rebind("SELECT events FROM qs_orders WHERE id = ?"), order)
	}
	if err == nil {
		fmt.Printf("%s on %s: OrderPlaced %s (txproducer) and ReceiptRequested (outbox) both applied\n", order, db.DriverName(), placed.EventID)
	}
	return err
}
