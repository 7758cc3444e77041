package rmqtxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The kit constructors build the real rmqtx components on a Broker and the
// user's database: nothing above the wire is replaced, so a test sees the
// components' own behaviour (retries, checks, dedup, order) against a broker
// it controls. Each fills in what only the broker knows (its name server)
// and what must be unique per component in one process (group and instance
// names), shortens the few defaults that are sized for a production broker's
// latencies and would make a test wait, starts the component with a bounded
// context, fails the test if it cannot, and shuts it down in t.Cleanup.
//
// Cleanups run last-in first-out, so a component made after NewBroker is
// shut down before the broker closes. A Broker from Start closed by a defer
// closes before the cleanups run: use NewBroker with the kit.
//
// Each constructor calls t.Fatalf, so call it from the test's goroutine.

// Test-friendly defaults the constructors put into fields left zero. The
// packages' own defaults are sized for a production broker; the kit's broker
// answers in-process within milliseconds, so only waits a test would sit
// through are shortened, never a bound a loaded test machine could hit.
const (
	// KitSendTimeout replaces the 3 s per-request send timeout of
	// txproducer and the outbox's RocketMQ sink. The broker answers at once
	// unless the test drops the answer on purpose (LoseEndTransaction on a
	// keyed Send, whose END_TRANSACTION rmqtx sends as a request and waits
	// for; Restart), and then this is how long the test waits.
	KitSendTimeout = time.Second
	// KitFenceAge replaces txproducer's 60 s FenceAge: a check of a half
	// with no txlog row answers UNKNOWN until the half is this old on the
	// wall clock (the broker's Advance does not age it), so a test of a
	// producer that died before its local transaction waits this long
	// before a check can fence the half. rmqtx's own broker tests use 4 s.
	KitFenceAge = 4 * time.Second
	// KitLocalTxTimeout replaces txproducer's 30 s LocalTxTimeout, which
	// must stay below FenceAge (a check must not fence a half whose local
	// transaction is still running). A test's local transaction takes
	// milliseconds; set it higher, with FenceAge, for a slow one.
	KitLocalTxTimeout = 3 * time.Second
	// KitRecoveryStartRetry replaces the 5 s interval at which discard
	// recovery looks for TRANS_CHECK_MAX_TIME_TOPIC while the name server
	// does not know it. With Options.NoAutoCreate it does not exist until
	// the first half is discarded (as on a production broker), and recovery
	// then starts consuming within this after DiscardHalves, not within 5 s.
	// Each look is one request to the in-process name server.
	KitRecoveryStartRetry = 200 * time.Millisecond
	// KitPollInterval replaces the dispatcher's 1 s PollInterval: rows
	// enqueued without Notify, and RETRY rows coming due, are claimed
	// within this instead of within a second. Each poll is one query.
	KitPollInterval = 50 * time.Millisecond
	// KitBackoffBase and KitBackoffMax replace the dispatcher's 500 ms and
	// 5 min retry backoff, sized to ride out a broker outage: after a
	// FailNextSend the row is sent again within milliseconds, and even the
	// 20th retry waits at most KitBackoffMax. A BackoffBase set above
	// KitBackoffMax raises the maximum to it (the dispatcher refuses a
	// maximum below the base).
	KitBackoffBase = 10 * time.Millisecond
	KitBackoffMax  = 250 * time.Millisecond
	// KitStartTimeout bounds each component's Start: its reachability
	// checks (each bounded by 5 s on their own), the producer's warm-up.
	KitStartTimeout = 15 * time.Second
	// KitShutdownTimeout bounds each component's Shutdown in t.Cleanup.
	// A shutdown that outlives it fails the test: a handler or a send that
	// hangs is a finding, not noise.
	KitShutdownTimeout = 15 * time.Second
)

// NewProducer builds, starts and (in t.Cleanup) shuts down a
// txproducer.Producer on b. Fields left zero get:
//
//   - NameServers: b.NameServers(), always (a Producer built on b talks to b);
//   - Group: a name unique to this call, from the test's name (a
//     transactional group must have one producer: the broker sends a half's
//     checks to any member of its group);
//   - InstanceName: unique to this call, so no two components share a client;
//   - SendTimeout KitSendTimeout, LocalTxTimeout KitLocalTxTimeout, FenceAge
//     KitFenceAge (at least LocalTxTimeout + 1 s when LocalTxTimeout is set),
//     RecoveryStartRetry KitRecoveryStartRetry; see each constant for why.
//
// Everything else keeps txproducer's defaults (SendRetries 2, discard
// recovery on, CheckTimeout 3 s). cfg.DB is the user's database with the
// txlog table (schema.MigrateAll); its pool must allow 2 connections.
func NewProducer(t testing.TB, b *Broker, cfg txproducer.Config) *txproducer.Producer {
	t.Helper()
	cfg = producerConfig(t, b, cfg)
	p, err := txproducer.New(cfg)
	if err != nil {
		t.Fatalf("rmqtxtest: new producer: %v", err)
	}
	if err := startBounded(p.Start); err != nil {
		t.Fatalf("rmqtxtest: start producer (group %s): %v", cfg.Group, err)
	}
	t.Cleanup(func() { shutdownBounded(t, "producer "+cfg.Group, p.Shutdown) })
	return p
}

// producerConfig is NewProducer's cfg with the kit's values filled in.
func producerConfig(t testing.TB, b *Broker, cfg txproducer.Config) txproducer.Config {
	cfg.NameServers = b.NameServers()
	if cfg.Group == "" {
		cfg.Group = kitName(t, "producer")
	}
	if cfg.InstanceName == "" {
		cfg.InstanceName = kitName(t, "producer-instance")
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = KitSendTimeout
	}
	if cfg.FenceAge <= 0 {
		cfg.FenceAge = KitFenceAge
		if cfg.LocalTxTimeout > 0 {
			cfg.FenceAge = max(KitFenceAge, cfg.LocalTxTimeout+time.Second)
		}
	}
	if cfg.LocalTxTimeout <= 0 {
		// Below FenceAge, as txproducer asks, also when the test set a
		// short FenceAge of its own.
		cfg.LocalTxTimeout = min(KitLocalTxTimeout, cfg.FenceAge*3/4)
	}
	if cfg.RecoveryStartRetry <= 0 {
		cfg.RecoveryStartRetry = KitRecoveryStartRetry
	}
	return cfg
}

// NewConsumer builds, starts and (in t.Cleanup) shuts down a
// consumer.Consumer on b. It sets NameServers to b.NameServers(), and fills
// in a Group (the dedup scope) and an InstanceName unique to this call when
// they are empty. Every processing default stays as the consumer package
// has it: the kit's broker redelivers a message sent back at once (unless
// Options.KeepRetryDelays), so the retry delays cost a test nothing, and a
// shorter ProcessTimeout or fewer MaxRetries/MaxWaits would change what the
// test proves. cfg.DB needs the consumer tables (schema.MigrateAll).
//
// A wait is the exception: an event that fails with class Wait (a strict
// version gap, consumer.Wait) waits for something another callback does,
// and redelivered at once it waits a few milliseconds per attempt, so
// MaxWaits (20, some 17 minutes of delays on a production broker) lasts
// well under a second. A test whose events wait for one
// another sets MaxWaits high enough that only the test's own deadline
// bounds the wait (as consumer's TestKitReorderedVersions does); else a
// loaded machine that holds the awaited event up that long parks the
// waiting ones.
//
// With Options.NoAutoCreate a topic missing at Start is waited for as on a
// production broker (polled every 5 s): create it with b.CreateTopic before
// NewConsumer.
func NewConsumer(t testing.TB, b *Broker, cfg consumer.Config) *consumer.Consumer {
	t.Helper()
	cfg = consumerConfig(t, b, cfg)
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatalf("rmqtxtest: new consumer: %v", err)
	}
	if err := startBounded(c.Start); err != nil {
		t.Fatalf("rmqtxtest: start consumer (group %s): %v", cfg.Group, err)
	}
	t.Cleanup(func() { shutdownBounded(t, "consumer "+cfg.Group, c.Shutdown) })
	return c
}

// consumerConfig is NewConsumer's cfg with the kit's values filled in.
func consumerConfig(t testing.TB, b *Broker, cfg consumer.Config) consumer.Config {
	cfg.NameServers = b.NameServers()
	//lint:ignore SA1019 a Config in the deprecated form still works: its group must not get a second one
	if cfg.Group == "" && cfg.ProcessorConfig.Group == "" {
		cfg.Group = kitName(t, "consumer")
	}
	if cfg.InstanceName == "" {
		cfg.InstanceName = kitName(t, "consumer-instance")
	}
	return cfg
}

// NewSink builds (started, as outbox.NewRocketMQSink returns it) an
// outbox.RocketMQSink on b and closes it in t.Cleanup. It sets NameServers
// to b.NameServers(), an InstanceName unique to this call when empty, and a
// SendTimeout of KitSendTimeout when zero. Group keeps the outbox default
// ("rmqtx_outbox"): a plain producer group needs no uniqueness.
//
// Made before the dispatchers that use it, it is closed after them.
func NewSink(t testing.TB, b *Broker, cfg outbox.RocketMQConfig) *outbox.RocketMQSink {
	t.Helper()
	cfg = sinkConfig(t, b, cfg)
	s, err := outbox.NewRocketMQSink(cfg)
	if err != nil {
		t.Fatalf("rmqtxtest: new outbox sink: %v", err)
	}
	t.Cleanup(func() { shutdownBounded(t, "outbox sink", s.Shutdown) })
	return s
}

// sinkConfig is NewSink's cfg with the kit's values filled in.
func sinkConfig(t testing.TB, b *Broker, cfg outbox.RocketMQConfig) outbox.RocketMQConfig {
	cfg.NameServers = b.NameServers()
	if cfg.InstanceName == "" {
		cfg.InstanceName = kitName(t, "sink")
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = KitSendTimeout
	}
	return cfg
}

// NewDispatcher builds, starts and (in t.Cleanup) shuts down an
// outbox.Dispatcher of cfg.DB's outbox table. When cfg.Sink is nil it sends
// to b through a sink of NewSink (closed after the dispatcher); a Sink the
// test passes is used as it is. Fields left zero get PollInterval
// KitPollInterval, BackoffBase KitBackoffBase and BackoffMax KitBackoffMax
// (at least BackoffBase); see each constant for why. LeaseDuration keeps its
// 30 s: a shorter lease lets a second dispatcher take over a row whose send
// is only slow, and a takeover test sets its own. cfg.DB needs the outbox
// table (schema.MigrateAll).
//
// Start is given a context that is never cancelled, because cancelling it
// stops the dispatcher; its reachability checks are bounded by 5 s each.
func NewDispatcher(t testing.TB, b *Broker, cfg outbox.Config) *outbox.Dispatcher {
	t.Helper()
	if cfg.Sink == nil {
		cfg.Sink = NewSink(t, b, outbox.RocketMQConfig{})
	}
	cfg = dispatcherConfig(cfg)
	d, err := outbox.NewDispatcher(cfg)
	if err != nil {
		t.Fatalf("rmqtxtest: new dispatcher: %v", err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatalf("rmqtxtest: start dispatcher: %v", err)
	}
	t.Cleanup(func() { shutdownBounded(t, "dispatcher "+d.Name(), d.Shutdown) })
	return d
}

// dispatcherConfig is NewDispatcher's cfg with the kit's timing filled in.
func dispatcherConfig(cfg outbox.Config) outbox.Config {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = KitPollInterval
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = KitBackoffBase
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = max(KitBackoffMax, cfg.BackoffBase)
	}
	return cfg
}

// startBounded runs a component's Start with a context bounded by
// KitStartTimeout.
func startBounded(start func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), KitStartTimeout)
	defer cancel()
	return start(ctx)
}

// shutdownBounded runs a component's Shutdown bounded by
// KitShutdownTimeout and reports an error as a test failure (t.Errorf: it
// runs in a cleanup, where the test's other cleanups must still run).
func shutdownBounded(t testing.TB, what string, shutdown func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), KitShutdownTimeout)
	defer cancel()
	if err := shutdown(ctx); err != nil {
		t.Errorf("rmqtxtest: shut down %s: %v", what, err)
	}
}

var nonNameChar = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// kitName returns a group or instance name unique to this call and readable
// in logs: rmqtxtest_<kind>_<end of the test's name>_<random>, within
// RocketMQ's name rule ([%|a-zA-Z0-9_-]{1,127}).
func kitName(t testing.TB, kind string) string {
	base := nonNameChar.ReplaceAllString(t.Name(), "_")
	if len(base) > 48 {
		base = base[len(base)-48:]
	}
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	return "rmqtxtest_" + kind + "_" + base + "_" + hex.EncodeToString(b)
}
