package rmqtxtest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the driver of the unreachable database below
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The constructors' defaults, checked without services: the kit's broker
// is in-process, and a Config is checked by the package's own New, which
// validates without connecting (a *sqlx.DB with no connection behind it).

// kitNoDB is a database handle that New accepts and nothing connects to.
func kitNoDB() *sqlx.DB { return sqlx.NewDb(nil, "mysql") }

// Zero fields get the kit's values, which txproducer.New accepts; set ones
// are kept, except NameServers, which is always the broker's; LocalTxTimeout
// stays below FenceAge whichever of the two the test set.
func TestKitProducerConfigDefaults(t *testing.T) {
	t.Parallel()
	b := NewBroker(t)

	c := producerConfig(t, b, txproducer.Config{DB: kitNoDB(), NameServers: []string{"10.0.0.1:9876"}})
	require.Equal(t, b.NameServers(), c.NameServers)
	require.NoError(t, rmqname.Group(c.Group))
	require.NotEmpty(t, c.InstanceName)
	require.Equal(t, KitSendTimeout, c.SendTimeout)
	require.Equal(t, KitFenceAge, c.FenceAge)
	require.Equal(t, KitLocalTxTimeout, c.LocalTxTimeout)
	require.Equal(t, KitRecoveryStartRetry, c.RecoveryStartRetry)
	require.Zero(t, c.SendRetries, "the client's retries keep txproducer's default")
	_, err := txproducer.New(c)
	require.NoError(t, err)

	other := producerConfig(t, b, txproducer.Config{DB: kitNoDB()})
	require.NotEqual(t, c.Group, other.Group, "one transactional group per producer")
	require.NotEqual(t, c.InstanceName, other.InstanceName)

	set := producerConfig(t, b, txproducer.Config{DB: kitNoDB(), Group: "payments", InstanceName: "mine",
		SendTimeout: 5 * time.Second, FenceAge: 30 * time.Second, LocalTxTimeout: 20 * time.Second,
		RecoveryStartRetry: time.Second})
	require.Equal(t, "payments", set.Group)
	require.Equal(t, "mine", set.InstanceName)
	require.Equal(t, 5*time.Second, set.SendTimeout)
	require.Equal(t, 30*time.Second, set.FenceAge)
	require.Equal(t, 20*time.Second, set.LocalTxTimeout)
	require.Equal(t, time.Second, set.RecoveryStartRetry)

	for _, tc := range []struct {
		name              string
		fence, local      time.Duration
		wantFence, wantTx time.Duration
	}{
		{"long local tx", 0, 10 * time.Second, 11 * time.Second, 10 * time.Second},
		{"short local tx", 0, time.Second, KitFenceAge, time.Second},
		{"short fence", 2 * time.Second, 0, 2 * time.Second, 1500 * time.Millisecond},
		{"long fence", 2 * time.Minute, 0, 2 * time.Minute, KitLocalTxTimeout},
	} {
		c := producerConfig(t, b, txproducer.Config{DB: kitNoDB(), FenceAge: tc.fence, LocalTxTimeout: tc.local})
		require.Equal(t, tc.wantFence, c.FenceAge, tc.name)
		require.Equal(t, tc.wantTx, c.LocalTxTimeout, tc.name)
		require.Less(t, c.LocalTxTimeout, c.FenceAge, tc.name)
	}
}

// The consumer gets the broker's name server and a unique group and
// instance name; every processing default stays the consumer package's.
func TestKitConsumerConfigDefaults(t *testing.T) {
	t.Parallel()
	b := NewBroker(t)
	routes := map[string]consumer.Route{"T": {Handler: func(context.Context, *sqlx.Tx, consumer.Event) error { return nil }}}

	c := consumerConfig(t, b, consumer.Config{DB: kitNoDB(), Routes: routes, Topic: "t"})
	require.Equal(t, b.NameServers(), c.NameServers)
	require.NoError(t, rmqname.Group(c.Group))
	require.NotEmpty(t, c.InstanceName)
	co, err := consumer.New(c)
	require.NoError(t, err)
	plain, err := consumer.New(consumer.Config{Group: c.Group, DB: kitNoDB(), Routes: routes, Topic: "t",
		NameServers: c.NameServers})
	require.NoError(t, err)
	got, want := co.Config(), plain.Config()
	require.Equal(t, want.ProcessTimeout, got.ProcessTimeout)
	require.Equal(t, want.MaxRetries, got.MaxRetries)
	require.Equal(t, want.MaxWaits, got.MaxWaits)
	require.Equal(t, want.MaxReconsumeTimes, got.MaxReconsumeTimes)
	require.Equal(t, want.VersionMode, got.VersionMode)

	other := consumerConfig(t, b, consumer.Config{})
	require.NotEqual(t, c.Group, other.Group)
	require.NotEqual(t, c.InstanceName, other.InstanceName)

	set := consumerConfig(t, b, consumer.Config{Group: "ledger", InstanceName: "mine"})
	require.Equal(t, "ledger", set.Group)
	require.Equal(t, "mine", set.InstanceName)

	// A Config in the deprecated form keeps its group there: setting the
	// flat Group too would be refused.
	old := consumerConfig(t, b, consumer.Config{Topic: "t",
		//lint:ignore SA1019 the deprecated form is what this case checks
		ProcessorConfig: consumer.ProcessorConfig{Group: "old", DB: kitNoDB(), Routes: routes}})
	require.Empty(t, old.Group)
	_, err = consumer.New(old)
	require.NoError(t, err)
}

// The sink and the dispatcher get the kit's timing where zero, keep what
// the test set, and outbox's validation accepts the result.
func TestKitOutboxConfigDefaults(t *testing.T) {
	t.Parallel()
	b := NewBroker(t)

	s := sinkConfig(t, b, outbox.RocketMQConfig{NameServers: []string{"10.0.0.1:9876"}})
	require.Equal(t, b.NameServers(), s.NameServers)
	require.Equal(t, KitSendTimeout, s.SendTimeout)
	require.NotEmpty(t, s.InstanceName)
	require.Empty(t, s.Group, "the outbox's own default group")
	require.NotEqual(t, s.InstanceName, sinkConfig(t, b, outbox.RocketMQConfig{}).InstanceName)
	kept := sinkConfig(t, b, outbox.RocketMQConfig{SendTimeout: 5 * time.Second, InstanceName: "mine"})
	require.Equal(t, 5*time.Second, kept.SendTimeout)
	require.Equal(t, "mine", kept.InstanceName)

	sink := outbox.FuncSink(func(context.Context, *outbox.Message) error { return nil })
	d := dispatcherConfig(outbox.Config{DB: kitNoDB(), Sink: sink})
	require.Equal(t, KitPollInterval, d.PollInterval)
	require.Equal(t, KitBackoffBase, d.BackoffBase)
	require.Equal(t, KitBackoffMax, d.BackoffMax)
	require.Zero(t, d.LeaseDuration, "the lease keeps outbox's default")
	_, err := outbox.NewDispatcher(d)
	require.NoError(t, err)

	slow := dispatcherConfig(outbox.Config{DB: kitNoDB(), Sink: sink, BackoffBase: time.Second, PollInterval: time.Minute})
	require.Equal(t, time.Second, slow.BackoffMax, "never below the base the test set")
	require.Equal(t, time.Minute, slow.PollInterval)
	_, err = outbox.NewDispatcher(slow)
	require.NoError(t, err)
}

// Names made from any test name are valid RocketMQ group names, at most
// 127 bytes, and differ per call.
func TestKitNames(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"plain", "with space/and.dots", strings.Repeat("long_", 30), "ünïcode"} {
		t.Run(name, func(t *testing.T) {
			a, b := kitName(t, "consumer-instance"), kitName(t, "consumer-instance")
			require.NoError(t, rmqname.Group(a))
			require.NoError(t, rmqname.Group("%RETRY%"+a), "its retry topic is valid too")
			require.NotEqual(t, a, b)
		})
	}
}

// The sink the kit builds sends to the broker, and is closed at cleanup.
func TestKitNewSinkSends(t *testing.T) {
	t.Parallel()
	b := NewBroker(t)
	s := NewSink(t, b, outbox.RocketMQConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, s.Send(ctx, &outbox.Message{Attempt: 1, Event: outbox.Event{
		EventID: "e-1", EventType: "T", Destination: "kit", Payload: []byte("{}")}}))
	msgs, err := b.WaitMessages(ctx, "kit", 1)
	require.NoError(t, err)
	require.Equal(t, "T", msgs[0].Tags)
}

// A component that cannot start fails the test with the cause, through
// t.Fatalf, and nothing is left to clean up. The database here is a closed
// port: every Start checks it first.
func TestKitStartFailureFailsTheTest(t *testing.T) {
	t.Parallel()
	b := NewBroker(t)
	db, err := sqlx.Open("mysql", "u:p@tcp("+testenv.ClosedAddr(t)+")/x?timeout=2s")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	routes := map[string]consumer.Route{"T": {Handler: func(context.Context, *sqlx.Tx, consumer.Event) error { return nil }}}

	for what, build := range map[string]func(testing.TB){
		"start producer":   func(r testing.TB) { NewProducer(r, b, txproducer.Config{DB: db}) },
		"start consumer":   func(r testing.TB) { NewConsumer(r, b, consumer.Config{DB: db, Routes: routes, Topic: "t"}) },
		"start dispatcher": func(r testing.TB) { NewDispatcher(r, b, outbox.Config{DB: db}) },
	} {
		r := &kitRecorder{name: t.Name()}
		r.run(build)
		require.True(t, r.fatal, what)
		require.Contains(t, r.msg, "rmqtxtest: "+what, what)
		require.Contains(t, r.msg, errclass.ErrDatabaseUnreachable.Error(), what)
		require.NotContains(t, r.msg, "u:p@", "no password in the message")
		// The dispatcher made its sink before failing: that one is
		// registered and closes cleanly.
		r.cleanup()
		require.False(t, r.errored, "%s: %s", what, r.msg)
	}
}

// kitRecorder is a testing.TB that records a Fatalf and ends the goroutine,
// as testing does, so a test can check that a constructor fails its test.
type kitRecorder struct {
	testing.TB // nil: gives the unexported method; the kit calls only those below
	name       string
	mu         sync.Mutex
	fatal      bool
	errored    bool
	msg        string
	cleanups   []func()
}

func (r *kitRecorder) Helper()      {}
func (r *kitRecorder) Name() string { return r.name }
func (r *kitRecorder) Cleanup(f func()) {
	r.mu.Lock()
	r.cleanups = append(r.cleanups, f)
	r.mu.Unlock()
}
func (r *kitRecorder) Logf(string, ...any) {}
func (r *kitRecorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errored, r.msg = true, fmt.Sprintf(format, args...)
}
func (r *kitRecorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.fatal, r.msg = true, fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// run runs f on its own goroutine, which Fatalf ends.
func (r *kitRecorder) run(f func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
}

// cleanup runs the registered cleanups, last first.
func (r *kitRecorder) cleanup() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// A keyed Send (here a business key) ends its transaction itself, with one
// END_TRANSACTION that the broker answers (txproducer's endsync.go), commit
// or rollback: the client sends none of its own. Its SendMessageInTransaction
// would end the half one-way as well, with UNKNOWN after a commit, which the
// real broker ignores but logs at WARN for every Send. A keyless Send keeps
// the client's one end, one-way in the patched build (client patch 8).
func TestKeyedSendEndsItsTransactionOnce(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, schema.MigrateAll(ctx, db, ""))
		b := NewBroker(t)
		p := NewProducer(t, b, txproducer.Config{DB: db})
		const topic = "orders"
		ends := func() (all, oneway int) {
			b.lock()
			defer b.unlock()
			return b.requests[reqEndTransaction], b.oneway[reqEndTransaction]
		}
		msg := func(key string) txproducer.Message {
			return txproducer.Message{Topic: topic, EventType: "OrderPlaced", BusinessKey: key,
				Payload: []byte(`{"order":"` + key + `"}`)}
		}
		nop := func(context.Context, *sqlx.Tx) error { return nil }
		// Start's warm-up probes are ended by the client, one-way: wait
		// until the broker has applied those ends before counting.
		testenv.Eventually(t, 10*time.Second, "the warm-up probes ended", func() bool { return len(b.Pending()) == 0 })
		all0, oneway0 := ends()

		res, err := p.Send(ctx, msg("k-commit"), nop)
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		require.Len(t, b.Messages(topic), 1, "a keyed Send returns once its event is stored")
		all, oneway := ends()
		require.Equal(t, all0+1, all, "one END_TRANSACTION for a keyed commit")
		require.Equal(t, oneway0, oneway, "answered, not one-way")

		refused := errors.New("refused")
		res, err = p.Send(ctx, msg("k-rollback"), func(context.Context, *sqlx.Tx) error { return refused })
		require.ErrorIs(t, err, refused)
		require.Equal(t, txproducer.StateRolledBack, res.State)
		var rolled []string
		for _, h := range b.RolledBack() {
			rolled = append(rolled, h.MsgID)
		}
		require.Contains(t, rolled, res.MsgID, "the keyed rollback was ended before Send returned")
		all, oneway = ends()
		require.Equal(t, all0+2, all, "one END_TRANSACTION for a keyed rollback")
		require.Equal(t, oneway0, oneway)
		require.Empty(t, b.Pending())

		res, err = p.Send(ctx, msg(""), nop)
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		_, err = b.WaitMessages(ctx, topic, 2)
		require.NoError(t, err, "the keyless Send's one-way end arrived")
		all, oneway = ends()
		require.Equal(t, all0+3, all, "the client's one END_TRANSACTION for a keyless Send")
		if testenv.PatchedClient() {
			require.Equal(t, oneway0+1, oneway, "marked one-way by client patch 8")
		}
	})
}
