// Package shutdown holds the one bound every rmqtx Close waits for.
//
// Each long-lived type (txproducer.Producer, consumer.Consumer,
// discard.Recovery, outbox.Dispatcher, outbox.RocketMQSink,
// replay.Replayer) has Shutdown(ctx), which waits for work in flight as long
// as ctx allows, and Close(), which is Shutdown bounded by
// DefaultCloseTimeout. One bound everywhere means a deferred Close can never
// hang a process for good, and never gives up sooner in one package than in
// another.
package shutdown

import (
	"context"
	"time"
)

// DefaultCloseTimeout bounds every Close. It is above the longest bounded
// step a Shutdown waits for with the defaults (a local transaction, 30 s, is
// the longest; sends and checks are a few seconds).
const DefaultCloseTimeout = 30 * time.Second

// Close calls shutdown with a context that ends after DefaultCloseTimeout.
func Close(shutdown func(context.Context) error) error {
	return CloseWithin(DefaultCloseTimeout, shutdown)
}

// CloseWithin calls shutdown with a context that ends after d. Tests use it
// to check the bound without waiting DefaultCloseTimeout.
func CloseWithin(d time.Duration, shutdown func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return shutdown(ctx)
}

// Wait runs stop, which takes no context (a client's Shutdown), and returns
// its error, or ctx's error when ctx ends first; stop then finishes in the
// background and its error is dropped.
func Wait(ctx context.Context, stop func() error) error {
	done := make(chan error, 1)
	go func() { done <- stop() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
