package shutdown

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestCloseWithinEndsAHangingShutdown(t *testing.T) {
	start := time.Now()
	err := CloseWithin(50*time.Millisecond, func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("returned after %s, want about 50ms", d)
	}
}

func TestCloseGivesTheDefaultBound(t *testing.T) {
	var left time.Duration
	_ = Close(func(ctx context.Context) error {
		dl, ok := ctx.Deadline()
		if !ok {
			t.Fatal("no deadline")
		}
		left = time.Until(dl)
		return nil
	})
	if left <= DefaultCloseTimeout-time.Second || left > DefaultCloseTimeout {
		t.Fatalf("deadline in %s, want about %s", left, DefaultCloseTimeout)
	}
}

func TestWait(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := Wait(ctx, func() error { <-block; return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hanging stop: err = %v, want DeadlineExceeded", err)
	}
	want := errors.New("x")
	if err := Wait(context.Background(), func() error { return want }); err != want {
		t.Fatalf("err = %v, want %v", err, want)
	}
}
