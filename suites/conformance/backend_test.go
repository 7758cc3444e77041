package conformance

import (
	"sync"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// Backend is a broker the scenarios run against: everything a scenario does
// goes through the raw client on NameServers, except what only the backend
// can do (create a topic, make the broker check, lose a request, restart).
type Backend interface {
	// NameServers are the name server addresses a client is given.
	NameServers() []string
	// BrokerAddr is the (one) master broker's address, for admin reads.
	BrokerAddr() string
	// CreateTopic creates topic with queues read and write queues and
	// returns once the name server routes it.
	CreateTopic(t testing.TB, topic string, queues int)
	// CheckUntil lets the broker check the pending halves until cond holds,
	// and fails t when it does not within the backend's bound. The fake
	// checks when told (CheckNow); the real broker checks on its own timer
	// (transactionTimeOut 3 s, transactionCheckInterval 2 s on the test
	// bed), so there it only waits, polling cond.
	CheckUntil(t testing.TB, what string, cond func() bool)
	// LoseEndTransaction drops the next n END_TRANSACTION requests
	// unanswered, leaving their halves pending. It reports false when the
	// backend cannot (the real broker): the scenario then reaches the same
	// state another way.
	LoseEndTransaction(n int) bool
	// Restart restarts the broker, keeping its store: every client
	// connection is dropped, and clients must reconnect. It returns once the
	// broker serves again. Only a backend opened with own set supports it.
	Restart(t testing.TB)
}

// openOpts say what broker a scenario needs.
type openOpts struct {
	// own asks for a broker the scenario may restart and that does not
	// create topics on first use (autoCreateTopicEnable=false).
	own bool
}

// backendKind opens a Backend for one scenario.
type backendKind struct {
	name string
	open func(t *testing.T, o openOpts) Backend
}

// checkBound bounds CheckUntil on the real broker: the first check of a
// half comes after transactionTimeOut plus up to one check interval, each
// further one an interval later; 20 s leaves room on a loaded machine.
const checkBound = 20 * time.Second

// Private broker ports of this package (each package that starts one has
// its own; the broker uses BrokerPort-2 and BrokerPort+1 too).
const (
	privateNamesrvPort = 17476
	privateBrokerPort  = 18911
)

// realKind is the broker of scripts/services.sh; scenarios that need a
// broker of their own share one private broker, one scenario at a time.
func realKind(parent *testing.T) backendKind {
	r := &realShared{parent: parent}
	return backendKind{name: "real", open: r.open}
}

type realShared struct {
	parent *testing.T

	mu      sync.Mutex // held by the scenario using the private broker
	once    sync.Once
	private *testenv.Private
}

func (r *realShared) open(t *testing.T, o openOpts) Backend {
	t.Helper()
	s := testenv.Integration(t)
	if !o.own {
		return &realBackend{nameServer: s.NameServer, broker: s.Broker}
	}
	r.mu.Lock()
	t.Cleanup(r.mu.Unlock)
	// Started by the first scenario that needs it, stopped when the whole
	// real backend's test ends (its cleanup runs on the parent test).
	r.once.Do(func() {
		r.private = testenv.PrivateBroker(cleanupOn{TB: t, parent: r.parent}, testenv.PrivateBrokerOptions{
			Name: "conformance", EnvPrefix: "RMQTX_CONFORMANCE",
			NamesrvPort: privateNamesrvPort, BrokerPort: privateBrokerPort,
		})
	})
	if r.private == nil {
		t.Fatal("the private broker did not start (see the scenario that started it)")
	}
	return &realBackend{nameServer: r.private.NameServer, broker: r.private.Addr, private: r.private}
}

// cleanupOn is t, with its cleanups registered on parent instead: for a
// resource one subtest starts and later ones share.
type cleanupOn struct {
	testing.TB
	parent testing.TB
}

func (c cleanupOn) Cleanup(f func()) { c.parent.Cleanup(f) }

type realBackend struct {
	nameServer, broker string
	private            *testenv.Private
}

func (b *realBackend) NameServers() []string { return []string{b.nameServer} }
func (b *realBackend) BrokerAddr() string    { return b.broker }

func (b *realBackend) CreateTopic(t testing.TB, topic string, queues int) {
	t.Helper()
	if b.private != nil {
		b.private.CreateTopic(t, topic, queues)
		return
	}
	testenv.CreateTopic(t, topic, queues)
}

func (b *realBackend) CheckUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, checkBound, what, cond)
}

// LoseEndTransaction: the real broker has no such fault.
func (b *realBackend) LoseEndTransaction(int) bool { return false }

func (b *realBackend) Restart(t testing.TB) {
	t.Helper()
	if b.private == nil {
		t.Fatal("Restart needs a backend opened with own (the shared broker is never restarted)")
	}
	// A SIGKILL, then a start on the same store: to the clients the same
	// as a clean restart (their connections drop, unannounced, and the
	// broker comes back at the same address with the same messages), and
	// ten seconds shorter than the broker's graceful shutdown here. The
	// fake's Restart does the same: it drops every connection.
	start := time.Now()
	if out, err := b.private.Run("kill9", "broker"); err != nil {
		t.Fatalf("services.sh kill9 broker: %v\n%s", err, out)
	}
	stopped := time.Now()
	// up waits until the broker registered with the name server again and
	// stored a probe send.
	if out, err := b.private.Run("up", "broker"); err != nil {
		t.Fatalf("services.sh up broker: %v\n%s", err, out)
	}
	t.Logf("private broker restarted: killed in %s, up again %s later", stopped.Sub(start).Round(100*time.Millisecond),
		time.Since(stopped).Round(100*time.Millisecond))
}

// kindOpener names a backend and opens it for the test of that backend.
type kindOpener struct {
	name string
	open func(t *testing.T) backendKind
}

// kinds are the backends every scenario runs on.
var kinds = []kindOpener{
	{name: "real", open: realKind},
	{name: "fake", open: fakeKind},
}
