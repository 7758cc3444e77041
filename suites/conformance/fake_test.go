package conformance

import (
	"context"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/rmqtxtest"
)

// fakeKind is rmqtxtest's in-process broker, a new one for each scenario
// (its faults and checks act on the whole broker, so scenarios running at
// the same time must not share one).
func fakeKind(*testing.T) backendKind {
	// The client's own log, quiet as on the real backend (testenv.Integration
	// installs it there).
	rmqlog.Install(nil)
	return backendKind{name: "fake", open: func(t *testing.T, o openOpts) Backend {
		return &fakeBackend{Broker: rmqtxtest.NewBroker(t, rmqtxtest.Options{NoAutoCreate: o.own})}
	}}
}

type fakeBackend struct {
	*rmqtxtest.Broker
}

func (b *fakeBackend) CreateTopic(t testing.TB, topic string, queues int) {
	b.Broker.CreateTopic(topic, queues)
}

// CheckUntil asks the broker for a check round (CheckNow, which returns
// once every check it sent was answered) until cond holds; between rounds
// it gives what the answers caused (a delivery) a moment to show. The
// rounds are not bounded by a clock the fake lacks but by checkBound.
func (b *fakeBackend) CheckUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(checkBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", checkBound, what)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := b.CheckNow(ctx)
		cancel()
		if err != nil {
			t.Fatalf("CheckNow: %v", err)
		}
		if testenv.Await(200*time.Millisecond, cond) {
			return
		}
	}
}

func (b *fakeBackend) LoseEndTransaction(n int) bool {
	b.Broker.LoseEndTransaction(n)
	return true
}

func (b *fakeBackend) Restart(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Broker.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
}
