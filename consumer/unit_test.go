package consumer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	rmq "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/migrate"

	"github.com/rmqtx/rmqtx/wire"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	cases := []struct {
		err       error
		class     Class
		retryable bool
	}{
		{Transient(base), ClassTransient, true},
		{Wait(base), ClassWait, true},
		{Permanent(base), ClassPermanent, false},
		{BadData(base), ClassData, false},
		{base, ClassUnknown, true},
		{fmt.Errorf("wrapped: %w", Permanent(base)), ClassPermanent, false},
		{fmt.Errorf("x: %w", ErrConflict), ClassConflict, false},
		{fmt.Errorf("x: %w", ErrVersionGap), ClassWait, true},
		{fmt.Errorf("x: %w", ErrMalformed), ClassData, false},
		{fmt.Errorf("x: %w", ErrUnknownEventType), ClassData, false},
		// the outermost class wins
		{Permanent(Transient(base)), ClassPermanent, false},
	}
	for _, c := range cases {
		require.Equal(t, c.class, ClassOf(c.err), c.err.Error())
		require.Equal(t, c.retryable, IsRetryable(c.err), c.err.Error())
	}
	require.Equal(t, Class(""), ClassOf(nil))
	require.ErrorIs(t, Transient(base), base)
	var ce *Error
	require.ErrorAs(t, fmt.Errorf("w: %w", Wait(base)), &ce)
	require.Equal(t, ClassWait, ce.Class)
	require.Equal(t, "boom", Permanent(base).Error(), "a class is stored beside the text, not in it")
	require.Equal(t, ClassTransient, ClassOf(Transient(nil)))
	require.Equal(t, "transient", Transient(nil).Error())
	require.False(t, IsRetryable(nil))
}

// TestUnclassifiedHandlerErrorIsUnknown: the consumer's fallback for an
// error nobody classified is Unknown, stated in handlerClass, and it is the
// shared fallback of errclass.ClassOf; the deprecated ClassOf agrees with
// errclass.ClassOf on every error.
func TestUnclassifiedHandlerErrorIsUnknown(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		errors.New("plain"),
		fmt.Errorf("wrapped: %w", errors.New("plain")),
		fmt.Errorf("%w", ErrHandlerPanic),
		fmt.Errorf("%w", ErrRetryLimit),
		context.DeadlineExceeded,
	} {
		require.Equal(t, ClassUnknown, handlerClass(err), err.Error())
		require.Equal(t, errclass.ClassOf(err), ClassOf(err), err.Error())
		require.True(t, IsRetryable(err), err.Error())
	}
	for _, err := range []error{
		Transient(errors.New("x")), Wait(errors.New("x")), Permanent(errors.New("x")), BadData(errors.New("x")),
		fmt.Errorf("%w", ErrConflict), fmt.Errorf("%w", ErrVersionGap), fmt.Errorf("%w", ErrMalformed),
		fmt.Errorf("%w", ErrUnknownEventType), nil,
	} {
		require.Equal(t, errclass.ClassOf(err), ClassOf(err), fmt.Sprint(err))
	}
	// The sentinels that decide a class keep their text and identity.
	require.Equal(t, "consumer: aggregate version gap", ErrVersionGap.Error())
	require.ErrorIs(t, fmt.Errorf("x: %w", Permanent(ErrMalformed)), ErrMalformed)
	var ce *Error
	require.ErrorAs(t, fmt.Errorf("x: %w", ErrConflict), &ce)
	require.Equal(t, ClassConflict, ce.Class)

	// The Processor's use of it, on both databases:
	// TestProcessHandlerErrorLeavesNoDedupRow (an unclassified handler
	// error is a retry of class unknown).
}

func TestDefaultDelayLevel(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1, DefaultDelayLevel(ClassTransient, 0))
	require.Equal(t, 1, DefaultDelayLevel(ClassTransient, 1))
	require.Equal(t, 4, DefaultDelayLevel(ClassTransient, 4))
	require.Equal(t, 14, DefaultDelayLevel(ClassUnknown, 40))
	require.Equal(t, 5, DefaultDelayLevel(ClassWait, 40))
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	db := idleDB() // never used: validation reads only its driver name
	h := func(context.Context, *sqlx.Tx, Event) error { return nil }
	good := ProcessorConfig{Group: "g", DB: db, Routes: map[string]Route{"T": {Handler: h}}}
	_, err := NewProcessor(good)
	require.NoError(t, err)
	// A driver without a dialect is a configuration error naming DB, for
	// the processor and for a dead-letter store alike.
	other := good
	other.DB = sqlx.NewDb(nil, "sqlite3")
	_, err = NewProcessor(other)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorIs(t, err, dialect.ErrUnsupported)
	require.ErrorContains(t, err, "DB: ")
	_, err = NewDeadLetterStore(other.DB, "")
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorIs(t, err, dialect.ErrUnsupported)

	d := good.WithDefaults()
	require.Equal(t, DefaultPrefix, d.TablePrefix)
	require.Equal(t, VersionStrict, d.VersionMode)
	require.Equal(t, 10, d.MaxRetries)
	require.Equal(t, 20, d.MaxWaits)
	require.EqualValues(t, 1, d.StrictFirstVersion)
	require.NotNil(t, d.Logger)
	neg := good
	neg.MaxRetries, neg.MaxWaits = -1, -5
	require.Equal(t, 0, neg.WithDefaults().MaxRetries)
	require.Equal(t, 0, neg.WithDefaults().MaxWaits)

	bad := []func(c *ProcessorConfig){
		func(c *ProcessorConfig) { c.Group = "" },
		func(c *ProcessorConfig) { c.DB = nil },
		func(c *ProcessorConfig) { c.Routes = nil },
		func(c *ProcessorConfig) { c.Routes = map[string]Route{"T": {}} },
		func(c *ProcessorConfig) { c.Routes = map[string]Route{"": {Handler: h}} },
		func(c *ProcessorConfig) { c.TablePrefix = "bad-prefix;" },
		func(c *ProcessorConfig) { c.VersionMode = 42 },
		func(c *ProcessorConfig) { c.Routes = map[string]Route{"T": {Handler: h, Version: -1}} },
		func(c *ProcessorConfig) { c.UnknownType = 9 },
	}
	for i, mut := range bad {
		c := good
		mut(&c)
		_, err := NewProcessor(c)
		require.ErrorIs(t, err, ErrConfig, "case %d", i)
	}

	cc := Config{NameServers: []string{"127.0.0.1:9876"}, Topic: "t"}
	cc.setProcessing(good)
	c, err := New(cc)
	require.NoError(t, err)
	require.Equal(t, 1, c.Config().BatchSize)
	require.Equal(t, 23, c.Config().MaxReconsumeTimes)
	require.True(t, strings.HasPrefix(c.Config().InstanceName, "rmqtx-consumer-g-"))
	c2, err := New(cc)
	require.NoError(t, err)
	require.NotEqual(t, c.Config().InstanceName, c2.Config().InstanceName, "instance names are unique per consumer")
	// Shutdown and Close before Start are no-ops; Start after them fails.
	require.NoError(t, c.Shutdown(context.Background()))
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Start(context.Background()), ErrClosed)

	noNS := cc
	noNS.NameServers = nil
	_, err = New(noNS)
	require.ErrorIs(t, err, ErrConfig)
	noTopic := cc
	noTopic.Topic = ""
	_, err = New(noTopic)
	require.ErrorIs(t, err, ErrConfig)
}

func TestMigrationsLoad(t *testing.T) {
	t.Parallel()
	fsys, names, err := Migrations("mysql", "pfx_")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"{{consume_log}}": "pfx_consume_log", "{{aggregate_version}}": "pfx_aggregate_version",
		"{{consume_attempt}}": "pfx_consume_attempt", "{{dead_letter}}": "pfx_dead_letter", "{{consume_window}}": "pfx_consume_window"}, names)
	migs, err := migrate.Load(fsys, ".")
	require.NoError(t, err)
	require.NotEmpty(t, migs)
	require.Equal(t, 1, migs[0].Version)
	pairs := []string{}
	for k, v := range names {
		pairs = append(pairs, k, v)
	}
	stmts := migrate.Statements(migs[0].SQL, strings.NewReplacer(pairs...))
	require.Len(t, stmts, 4)
	for _, s := range stmts {
		require.True(t, strings.HasPrefix(s, "CREATE TABLE IF NOT EXISTS pfx_"), s)
		require.NotContains(t, s, "{{")
		require.NotContains(t, s, "--")
	}
	for _, d := range []string{"mysql", "postgres"} {
		fsys, names, err = Migrations(d, "")
		require.NoError(t, err, d)
		require.Equal(t, DefaultPrefix+"dead_letter", names["{{dead_letter}}"])
		migs, err := migrate.Load(fsys, ".")
		require.NoError(t, err, d)
		require.NotEmpty(t, migs, d)
	}
	for _, d := range []string{"", "sqlite3", "oracle", "../mysql", "mysql/x", "postgres/.."} {
		_, _, err = Migrations(d, "")
		require.ErrorIs(t, err, ErrConfig, "dialect %q", d)
	}
	_, _, err = Migrations("mysql", "x;DROP")
	require.ErrorIs(t, err, ErrConfig)
	_, err = newTables("x;DROP")
	require.ErrorIs(t, err, ErrConfig)
}

func TestClip(t *testing.T) {
	t.Parallel()
	require.Equal(t, "abc", clip("abcdef", 3))
	require.Equal(t, "héé", clip("hééllo", 3))
	require.Equal(t, "a?b", clip("a\xffb", 10))
}

func TestReplayProperties(t *testing.T) {
	t.Parallel()
	in := map[string]string{
		wire.PropEventID: "e1", wire.HeaderPrefix + "trace": "t", "KEYS": "k", "TAGS": "tag",
		"UNIQ_KEY": "u", "CONSUME_START_TIME": "1", propReconsume: "3", "MIN_OFFSET": "0",
	}
	out := replayProperties(in)
	require.Equal(t, map[string]string{wire.PropEventID: "e1", wire.HeaderPrefix + "trace": "t", "KEYS": "k", "TAGS": "tag"}, out)
}

func TestMessageFromExt(t *testing.T) {
	t.Parallel()
	m := &primitive.MessageExt{MsgId: "m1", QueueOffset: 7, ReconsumeTimes: 1, StoreTimestamp: 1700000000000}
	m.Topic = "%RETRY%grp"
	m.Body = []byte("x")
	m.Queue = &primitive.MessageQueue{QueueId: 2}
	m.WithProperty(primitive.PropertyRetryTopic, "orders")
	m.WithProperty(propReconsume, "4")
	got := MessageFromExt(m)
	require.Equal(t, "orders", got.Delivery.Topic)
	require.Equal(t, 2, got.Delivery.QueueID)
	require.EqualValues(t, 7, got.Delivery.QueueOffset)
	require.Equal(t, 4, got.Delivery.ReconsumeTimes, "our own re-send counter wins when higher")
	require.Equal(t, int64(1700000000000), got.Delivery.StoredAt.UnixMilli())
}

type fakeResender struct {
	sent []string
	err  error
}

func (f *fakeResender) Resend(_ context.Context, m *primitive.MessageExt, level int) error {
	if f.err != nil {
		return f.err
	}
	f.sent = append(f.sent, fmt.Sprintf("%s@%d", m.GetProperty(wire.PropEventID), level))
	return nil
}

func batchOf(ids ...string) []*primitive.MessageExt {
	var out []*primitive.MessageExt
	for _, id := range ids {
		m := &primitive.MessageExt{}
		m.WithProperty(wire.PropEventID, id)
		out = append(out, m)
	}
	return out
}

func TestConsumeBatch(t *testing.T) {
	t.Parallel()
	// process: "r*" ids need a retry at level 3, "p*" are parked, others apply.
	var runs []string
	process := func(_ context.Context, m Message) Outcome {
		id := m.Properties[wire.PropEventID]
		runs = append(runs, id)
		switch id[0] {
		case 'r':
			return Outcome{Result: ResultRetry, DelayLevel: 3}
		case 'p':
			return Outcome{Result: ResultParked}
		}
		return Outcome{Result: ResultApplied}
	}
	newCtx := func() (context.Context, *primitive.ConsumeConcurrentlyContext) {
		cc := primitive.NewConsumeConcurrentlyContext()
		return primitive.WithConcurrentlyCtx(context.Background(), cc), cc
	}

	t.Run("single message retries natively", func(t *testing.T) {
		runs = nil
		ctx, cc := newCtx()
		rs := &fakeResender{}
		res, err := consumeBatch(ctx, process, rs, batchOf("r1"))
		require.NoError(t, err)
		require.Equal(t, rmq.ConsumeRetryLater, res)
		require.Equal(t, 3, cc.DelayLevelWhenNextConsume)
		require.Empty(t, rs.sent)
	})
	t.Run("poison and retry in a batch do not hand back the others", func(t *testing.T) {
		runs = nil
		ctx, cc := newCtx()
		rs := &fakeResender{}
		res, err := consumeBatch(ctx, process, rs, batchOf("a1", "p1", "r1", "a2"))
		require.NoError(t, err)
		require.Equal(t, rmq.ConsumeSuccess, res)
		require.Equal(t, []string{"a1", "p1", "r1", "a2"}, runs, "each message processed once")
		require.Equal(t, []string{"r1@3"}, rs.sent, "only the failed message is re-sent")
		require.Equal(t, 0, cc.DelayLevelWhenNextConsume)
	})
	t.Run("resend failure hands the whole batch back", func(t *testing.T) {
		runs = nil
		ctx, cc := newCtx()
		res, err := consumeBatch(ctx, process, &fakeResender{err: errors.New("down")}, batchOf("a1", "r1"))
		require.NoError(t, err)
		require.Equal(t, rmq.ConsumeRetryLater, res)
		require.Equal(t, 3, cc.DelayLevelWhenNextConsume)
	})
	t.Run("all applied", func(t *testing.T) {
		runs = nil
		ctx, _ := newCtx()
		res, err := consumeBatch(ctx, process, nil, batchOf("a1", "p2", "a3"))
		require.NoError(t, err)
		require.Equal(t, rmq.ConsumeSuccess, res)
		require.Len(t, runs, 3)
	})
}
