// Command previous is a service written against rmqtx's previous release
// (commit f53b9c9, before issue 22): a transactional producer, an outbox
// with its RocketMQ sink, a consumer, a replayer and an archiver, each with
// a logger and the Prometheus metrics. It is never run, only compiled: the
// upgrade test rewrites it with the rules of ../rules.txt and builds the
// result against the current tree.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/archive"
	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

const prefix = "shop_"

var nameServers = []string{"127.0.0.1:9876"}

func main() {
	if err := run(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	db, err := sqlx.Open("mysql", os.Getenv("SHOP_DSN"))
	if err != nil {
		return err
	}
	log := logrus.New()
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		return err
	}

	store, err := txlog.New(db, prefix)
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if err := outbox.Migrate(ctx, db, prefix); err != nil {
		return err
	}

	p, err := txproducer.New(txproducer.Config{
		NameServers: nameServers,
		Group:       "shop_tx",
		DB:          db,
		Log:         store,
		Metrics:     m,
		Logger:      log,
		OnRecovery: func(r checkback.RecoveryResult) {
			log.WithField("event_id", r.EventID).Info("recovered")
		},
	})
	if err != nil {
		return err
	}
	if err := p.Start(ctx); err != nil {
		return err
	}
	defer p.Close()
	res, err := p.Send(ctx, txproducer.Message{Topic: "orders", EventType: "OrderPlaced", Payload: []byte(`{}`)},
		func(ctx context.Context, tx *sqlx.Tx) error { return nil })
	if err != nil {
		return err
	}
	log.WithField("event_id", res.EventID).Info("sent")

	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: nameServers, Logger: log})
	if err != nil {
		return err
	}
	defer sink.Close()
	d, err := outbox.NewDispatcher(outbox.Config{DB: db, TablePrefix: prefix, Sink: sink, Metrics: m, Logger: log})
	if err != nil {
		return err
	}
	if err := d.Start(ctx); err != nil {
		return err
	}
	defer d.Close()

	c, err := consumer.New(consumer.Config{
		ProcessorConfig: consumer.ProcessorConfig{
			Group:       "shop_points",
			DB:          db,
			TablePrefix: prefix,
			Routes: map[string]consumer.Route{"OrderPlaced": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
				if _, err := tx.ExecContext(ctx, "UPDATE points SET n = n + 1"); err != nil {
					return consumer.Transient(err)
				}
				return nil
			}}},
			Metrics: m,
			Logger:  log,
		},
		NameServers: nameServers,
		Topic:       "orders",
	})
	if err != nil {
		return err
	}
	if err := c.Start(ctx); err != nil {
		return err
	}
	defer c.Close()

	r, err := replay.New(replay.Config{DB: db, TablePrefix: prefix, NameServers: nameServers, Metrics: m, Logger: log})
	if err != nil {
		return err
	}
	defer r.Close()

	a, err := archive.New(archive.Config{DB: db, TablePrefix: prefix, Logger: log})
	if err != nil {
		return err
	}
	if _, err := a.Run(ctx); err != nil {
		var ce *consumer.Error
		if errors.As(err, &ce) {
			log.WithField("class", ce.RetryClass()).Warn("archive")
		}
		return err
	}
	return nil
}
