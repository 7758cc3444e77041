package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/wire"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	cases := []struct {
		err   error
		class Class
		code  string
	}{
		{Permanent(base), ClassPermanent, "permanent"},
		{Transient(base), ClassTransient, "transient"},
		{Unknown(base), ClassUnknown, "unknown"},
		{base, ClassTransient, "transient"},
		{fmt.Errorf("wrapped: %w", Permanent(base)), ClassPermanent, "permanent"},
		{fmt.Errorf("%w: %w", base, context.DeadlineExceeded), ClassUnknown, "unknown"},
		{NewSendError(ClassPermanent, "no_permission", base), ClassPermanent, "no_permission"},
	}
	for _, c := range cases {
		require.Equal(t, c.class, ClassOf(c.err), c.err)
		require.Equal(t, c.code, CodeOf(c.err), c.err)
		require.ErrorIs(t, c.err, base)
	}
	require.Nil(t, Permanent(nil))
	require.True(t, IsPermanent(Permanent(base)))
	require.False(t, IsPermanent(nil))
	require.True(t, IsRetryable(Unknown(base)))
	require.True(t, IsUnknown(Unknown(base)))
	require.False(t, IsRetryable(Permanent(base)))
}

func TestFromHTTPStatus(t *testing.T) {
	t.Parallel()
	require.NoError(t, FromHTTPStatus(http.StatusOK))
	require.NoError(t, FromHTTPStatus(http.StatusNoContent))
	for _, c := range []int{408, 425, 429, 500, 502, 503, 504} {
		require.Equal(t, ClassTransient, ClassOf(FromHTTPStatus(c)), c)
	}
	for _, c := range []int{400, 401, 403, 404, 409, 422, 501} {
		require.True(t, IsPermanent(FromHTTPStatus(c)), c)
	}
	require.Equal(t, "http_503", CodeOf(FromHTTPStatus(503)))
}

func TestClassifyRocketMQ(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cases := []struct {
		err      error
		class    Class
		code     string
		sentinel error
	}{
		{errors.New("CODE: 17  DESC: topic[x] not exist, apply first please!"), ClassTransient, "topic_not_exist", ErrTopicNotExist},
		{errors.New("CODE: 16, DESC: Sending message to topic[SELF_TEST_TOPIC] is forbidden."), ClassPermanent, "no_permission", ErrNoPermission},
		{errors.New("CODE: 13, DESC: the message body size over max value, MAX: 4194304"), ClassPermanent, "message_illegal", ErrMessageIllegal},
		{errors.New("CODE: 14, DESC: service not available now"), ClassTransient, "service_not_available", nil},
		{errors.New("CODE: 2, DESC: [PCBUSY_CLEAN_QUEUE]broker busy"), ClassTransient, "system_busy", nil},
		{errors.New("CODE: 215, DESC: new"), ClassTransient, "broker_code_215", nil},
		{rmqerrors.ErrRequestTimeout, ClassUnknown, "timeout", ErrSendTimeout},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), ClassUnknown, "timeout", ErrSendTimeout},
		{errors.New("the topic=t route info not found"), ClassTransient, "no_route", ErrNoRoute},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), ClassTransient, "connection_refused", nil},
		{io.EOF, ClassUnknown, "connection_lost", nil},
		{fmt.Errorf("write: %w", syscall.EPIPE), ClassUnknown, "connection_lost", nil},
		{rmqerrors.ErrNotRunning, ClassTransient, "not_running", nil},
		{errors.New("something else"), ClassTransient, "transient", nil},
	}
	for _, c := range cases {
		got := classifyRocketMQ(ctx, c.err)
		require.Equal(t, c.class, ClassOf(got), c.err)
		require.Equal(t, c.code, CodeOf(got), c.err)
		if c.sentinel != nil {
			require.ErrorIs(t, got, c.sentinel)
		}
		require.ErrorIs(t, got, c.err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	require.Equal(t, "canceled", CodeOf(classifyRocketMQ(cctx, errors.New("x"))))
}

func TestBackoffFullJitterIsBounded(t *testing.T) {
	t.Parallel()
	base, max := 100*time.Millisecond, 3*time.Second
	require.Equal(t, base, BackoffCeiling(0, base, max))
	require.Equal(t, 800*time.Millisecond, BackoffCeiling(3, base, max))
	require.Equal(t, max, BackoffCeiling(5, base, max))
	require.Equal(t, max, BackoffCeiling(80, base, max))
	require.Equal(t, max, BackoffCeiling(40, time.Hour, max))
	for n := 0; n < 10; n++ {
		var sum time.Duration
		for i := 0; i < 2000; i++ {
			d := Backoff(n, base, max)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, BackoffCeiling(n, base, max))
			sum += d
		}
		// full jitter: the mean is about half the ceiling (not a timing
		// assertion: it checks the distribution of a computed value)
		mean := sum / 2000
		ceil := BackoffCeiling(n, base, max)
		require.InDelta(t, float64(ceil)/2, float64(mean), float64(ceil)*0.1, "n=%d", n)
	}
}

type nopSink struct{}

func (nopSink) Send(context.Context, *Message) error { return nil }

func TestConfigDefaultsAndValidation(t *testing.T) {
	t.Parallel()
	c := Config{}.WithDefaults()
	require.Equal(t, DefaultPrefix, c.TablePrefix)
	require.Equal(t, 64, c.BatchSize)
	require.Equal(t, 16, c.Concurrency)
	require.Equal(t, time.Second, c.PollInterval)
	require.Equal(t, 30*time.Second, c.LeaseDuration)
	require.Equal(t, 10*time.Second, c.SendTimeout)
	require.Equal(t, 20, c.MaxRetries)
	require.Regexp(t, nameRE, c.Name)
	require.Equal(t, 0, Config{MaxRetries: -1}.WithDefaults().MaxRetries)

	_, err := NewDispatcher(Config{Sink: nopSink{}})
	require.ErrorIs(t, err, ErrConfig)
	// a DB is required before anything else is looked at; use a typed nil
	// check through the remaining fields with a fake DB below
	_, err = NewDispatcher(Config{TablePrefix: "bad-prefix;", Sink: nopSink{}})
	require.ErrorIs(t, err, ErrConfig)
}

// The SQL follows the database the handle names; a driver rmqtx has no
// dialect for is refused as a configuration error before any statement.
func TestUnsupportedDriverIsAConfigError(t *testing.T) {
	t.Parallel()
	other := sqlx.NewDb(nil, "sqlite3") // never reached: the handle is refused first
	_, err := NewDispatcher(Config{DB: other, Sink: nopSink{}})
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "invalid config: DB")
	require.ErrorContains(t, err, `"sqlite3"`)

	tb, err := NewTable("")
	require.NoError(t, err)
	ctx := context.Background()
	_, err = tb.Enqueue(ctx, other, Event{EventType: "T", Destination: "d"})
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, `"sqlite3"`)
	_, err = Enqueue(ctx, other, Event{EventType: "T", Destination: "d"})
	require.ErrorIs(t, err, ErrConfig)
	_, err = tb.Get(ctx, other, "e1")
	require.ErrorIs(t, err, ErrConfig)
	_, err = tb.Backlog(ctx, other)
	require.ErrorIs(t, err, ErrConfig)
}

// plainExecer is a handle that does not name its driver, as *sql.Tx: it
// records the statements it is given and answers one affected row.
type plainExecer struct{ queries []string }

func (p *plainExecer) ExecContext(_ context.Context, query string, _ ...any) (sql.Result, error) {
	p.queries = append(p.queries, query)
	return driver.RowsAffected(1), nil
}

// A handle that names no driver gets SQL only from a table bound to one
// (WithDriver), in that database's own syntax; unbound, it is a
// configuration error before any statement.
func TestEnqueueOnAHandleWithoutDriver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ev := Event{EventID: "e1", EventType: "T", Destination: "d"}
	tb, err := NewTable("")
	require.NoError(t, err)
	h := &plainExecer{}
	_, err = tb.Enqueue(ctx, h, ev)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, "*outbox.plainExecer does not name its database driver")
	_, err = Enqueue(ctx, h, ev)
	require.ErrorIs(t, err, ErrConfig)
	require.Empty(t, h.queries, "nothing sent for a guessed database")
	_, err = tb.WithDriver("sqlite3")
	require.ErrorIs(t, err, ErrConfig)

	for driver, want := range map[string][]string{
		"mysql": {"INSERT INTO rmqtx_outbox (", "VALUES (?, ?", "UTC_TIMESTAMP(6)"},
		"pgx":   {"INSERT INTO rmqtx_outbox (", "VALUES ($1, $2", "ON CONFLICT (event_id) DO NOTHING"},
	} {
		bound, err := tb.WithDriver(driver)
		require.NoError(t, err)
		h := &plainExecer{}
		id, err := bound.Enqueue(ctx, h, ev)
		require.NoError(t, err)
		require.Equal(t, "e1", id)
		require.Len(t, h.queries, 1)
		for _, w := range want {
			require.Contains(t, h.queries[0], w, driver)
		}
	}
	// A handle that names its driver is taken at its word, even by a bound
	// table.
	mysqlT, err := tb.WithDriver("mysql")
	require.NoError(t, err)
	_, err = mysqlT.Enqueue(ctx, sqlx.NewDb(nil, "sqlite3"), ev)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorContains(t, err, `"sqlite3"`)
}

func TestNewTable(t *testing.T) {
	t.Parallel()
	tb, err := NewTable("")
	require.NoError(t, err)
	require.Equal(t, "rmqtx_outbox", tb.Name())
	tb, err = NewTable("svc_a_")
	require.NoError(t, err)
	require.Equal(t, "svc_a_outbox", tb.Name())
	_, err = NewTable("x; DROP TABLE y")
	require.ErrorIs(t, err, ErrConfig)
}

func TestEventValidate(t *testing.T) {
	t.Parallel()
	ok := Event{EventID: "e1", EventType: "T", Destination: "topic"}
	require.NoError(t, ok.Validate())
	bad := map[string]Event{
		"no type":        {EventID: "e1", Destination: "d"},
		"no destination": {EventID: "e1", EventType: "T"},
		"long dest":      {EventID: "e1", EventType: "T", Destination: strings.Repeat("d", 129)},
		"agg half":       {EventID: "e1", EventType: "T", Destination: "d", AggregateID: "1"},
		"control char":   {EventID: "e\x01", EventType: "T", Destination: "d"},
		"neg version":    {EventID: "e1", EventType: "T", Destination: "d", AggregateType: "A", AggregateID: "1", AggregateVersion: -1},
	}
	for name, e := range bad {
		err := e.Validate()
		require.ErrorIs(t, err, ErrInvalidEvent, name)
	}
	require.ErrorIs(t, bad["control char"].Validate(), wire.ErrInvalid)
	_, err := Enqueue(context.Background(), nil, ok)
	require.ErrorIs(t, err, ErrInvalidEvent)
}

func TestRocketMQMessage(t *testing.T) {
	t.Parallel()
	m := &Message{Event: Event{EventID: "e1", EventType: "OrderPaid", EventVersion: 2, AggregateType: "Order",
		AggregateID: "o-7", AggregateVersion: 3, Destination: "t", MessageKey: "pay-1", Payload: []byte("{}"),
		Headers: map[string]string{"trace": "x"}}, Attempt: 1}
	msg := RocketMQMessage(m)
	require.Equal(t, "pay-1 e1", msg.GetKeys())
	require.Equal(t, "OrderPaid", msg.GetTags())
	require.Equal(t, "Order/o-7", msg.GetShardingKey())
	env, err := wire.Decode(msg.GetProperties())
	require.NoError(t, err)
	require.Equal(t, m.Envelope(), env)
	require.Equal(t, "e1", m.IdempotencyKey())

	m2 := &Message{Event: Event{EventID: "e2", EventType: "T", Destination: "t"}}
	require.Equal(t, "", RocketMQMessage(m2).GetShardingKey())
	require.Equal(t, "e2", RocketMQMessage(m2).GetKeys())
}

func TestRocketMQSinkRejectsBadTopicLocally(t *testing.T) {
	t.Parallel()
	// The topic check runs before the client is touched.
	s := &RocketMQSink{}
	err := s.Send(context.Background(), &Message{Event: Event{EventID: "e", EventType: "T", Destination: "bad topic!"}})
	require.True(t, IsPermanent(err))
	require.ErrorIs(t, err, ErrInvalidDestination)
	_, err = NewRocketMQSink(RocketMQConfig{})
	require.ErrorIs(t, err, ErrConfig)
}

func TestTruncate(t *testing.T) {
	t.Parallel()
	require.Equal(t, "abc", truncate("abc", 5))
	require.Equal(t, "ab", truncate("abc", 2))
	s := truncate("aé", 2) // é is two bytes: do not cut it in half
	require.Equal(t, "a", s)
}

func TestShutdownWithoutStartAndNotifyNeverBlock(t *testing.T) {
	t.Parallel()
	d := &Dispatcher{wake: make(chan struct{}, 1)}
	for i := 0; i < 5; i++ {
		d.Notify()
	}
	require.NoError(t, d.Shutdown(context.Background()))
	require.NoError(t, d.Close())
	require.ErrorIs(t, d.Start(context.Background()), ErrClosed)
}
