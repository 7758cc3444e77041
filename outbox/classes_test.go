package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"

	"github.com/rmqtx/rmqtx/consumer"
)

// ownClassified is a caller's own error type carrying a class name.
type ownClassified struct{ name string }

func (e ownClassified) Error() string              { return "own: " + e.name }
func (e ownClassified) ErrorClass() errclass.Class { return errclass.Class(e.name) }

// A FuncSink may call code that classifies with the consumer package's
// vocabulary: those errors keep their meaning for a send.
func TestClassOfRecognisesConsumerErrors(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	cases := []struct {
		err   error
		class Class
		code  string
	}{
		{consumer.Permanent(base), ClassPermanent, "permanent"},
		{fmt.Errorf("sink: %w", consumer.Permanent(base)), ClassPermanent, "permanent"},
		{consumer.BadData(base), ClassPermanent, "permanent"},
		{&consumer.Error{Class: consumer.ClassConflict, Err: base}, ClassPermanent, "permanent"},
		{consumer.Transient(base), ClassTransient, "transient"},
		{consumer.Wait(base), ClassTransient, "transient"},
		{&consumer.Error{Class: consumer.ClassUnknown, Err: base}, ClassUnknown, "unknown"},
		// the outermost classified error wins, whichever package made it
		{consumer.Transient(Permanent(base)), ClassTransient, "transient"},
		{NewSendError(ClassPermanent, "no_permission", consumer.Transient(base)), ClassPermanent, "no_permission"},
		// any errclass.Classified error type joins the vocabulary
		{ownClassified{"permanent"}, ClassPermanent, "permanent"},
		// a name outside the vocabulary is unclassified
		{ownClassified{"bogus"}, ClassTransient, "transient"},
		{fmt.Errorf("%w: %w", ownClassified{"bogus"}, context.DeadlineExceeded), ClassUnknown, "unknown"},
	}
	for _, c := range cases {
		require.Equal(t, c.class, ClassOf(c.err), c.err.Error())
		require.Equal(t, c.code, CodeOf(c.err), c.err.Error())
	}
	require.True(t, IsPermanent(consumer.Permanent(base)))
	require.True(t, IsRetryable(consumer.Wait(base)))
	for _, c := range []Class{ClassTransient, ClassUnknown, ClassPermanent} {
		e := &SendError{Class: c, Code: "x", Err: base}
		require.Equal(t, c, e.ErrorClass())
		require.Equal(t, c, ClassOf(e))
	}
}

// TestUnclassifiedSendErrorIsTransient: the dispatcher's fallback for a
// send error nobody classified is its own, stated in sendClassOf, and not
// errclass.ClassOf's Unknown: a plain error is retried as transient (code
// "transient", counted in Stats().Retried), a context deadline as unknown
// (code "unknown", Stats().Unknown); both with backoff, then DEAD at
// MaxRetries.
func TestUnclassifiedSendErrorIsTransient(t *testing.T) {
	t.Parallel()
	plain := errors.New("connection refused")
	deadline := fmt.Errorf("downstream: %w", context.DeadlineExceeded)
	require.Equal(t, errclass.Unknown, errclass.ClassOf(plain), "the shared fallback")
	require.Equal(t, ClassTransient, ClassOf(plain), "the outbox's own")
	require.Equal(t, ClassUnknown, ClassOf(deadline))
	eachDB(t, func(t *testing.T, b *bed) { testUnclassifiedSendErrorIsTransient(t, b, plain, deadline) })
}

func testUnclassifiedSendErrorIsTransient(t *testing.T, b *bed, plain, deadline error) {
	evs := events("cmd", 2)
	evs[1].EventType = "TimesOut"
	sink := FuncSink(func(_ context.Context, m *Message) error {
		if m.EventType == "TimesOut" {
			return deadline
		}
		return plain
	})
	ids := b.enqueue(t, evs...)
	d := b.dispatcher(t, Config{Sink: sink, PollInterval: 20 * time.Millisecond, BackoffBase: time.Millisecond,
		BackoffMax: 5 * time.Millisecond, MaxRetries: 2})
	b.waitStatus(t, StatusDead, 2, time.Minute)
	for i, want := range []struct{ code, text string }{{"transient", plain.Error()}, {"unknown", deadline.Error()}} {
		row, err := b.table.Get(context.Background(), b.db, ids[i])
		require.NoError(t, err)
		require.Equal(t, 2, row.RetryCount, "retried with backoff, not DEAD at once")
		require.Equal(t, want.code, row.LastErrorCode)
		require.Equal(t, want.text, row.LastErrorMessage)
	}
	st := d.Stats()
	require.EqualValues(t, 2, st.Retried, "the plain error's two retries")
	require.EqualValues(t, 2, st.Unknown, "the deadline's two retries")
	require.EqualValues(t, 2, st.Dead)
}
