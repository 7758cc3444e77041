package consumer

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"

	"github.com/rmqtx/rmqtx/outbox"
)

// ownClassified is a caller's own error type carrying a class name.
type ownClassified struct{ name string }

func (e ownClassified) Error() string              { return "own: " + e.name }
func (e ownClassified) ErrorClass() errclass.Class { return errclass.Class(e.name) }

// A handler may return the outbox package's classified errors (a handler
// that writes a command outbox row often shares helpers with a sink): they
// keep their meaning here instead of falling to "unknown" and being retried.
func TestClassOfRecognisesOutboxErrors(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	cases := []struct {
		err       error
		class     Class
		retryable bool
	}{
		{outbox.Permanent(base), ClassPermanent, false},
		{fmt.Errorf("handler: %w", outbox.Permanent(base)), ClassPermanent, false},
		{outbox.Transient(base), ClassTransient, true},
		{outbox.Unknown(base), ClassUnknown, true},
		{outbox.NewSendError(outbox.ClassPermanent, "no_permission", base), ClassPermanent, false},
		{outbox.FromHTTPStatus(400), ClassPermanent, false},
		{outbox.FromHTTPStatus(503), ClassTransient, true},
		// the outermost classified error wins, whichever package made it
		{Transient(outbox.Permanent(base)), ClassTransient, true},
		{outbox.Permanent(Transient(base)), ClassPermanent, false},
		// any errclass.Classified error type joins the vocabulary
		{ownClassified{"data"}, ClassData, false},
		{fmt.Errorf("w: %w", ownClassified{"wait"}), ClassWait, true},
		// a name outside the vocabulary is unclassified
		{ownClassified{"bogus"}, ClassUnknown, true},
		{fmt.Errorf("x: %w: %w", ownClassified{"bogus"}, ErrMalformed), ClassData, false},
	}
	for _, c := range cases {
		require.Equal(t, c.class, ClassOf(c.err), c.err.Error())
		require.Equal(t, c.retryable, IsRetryable(c.err), c.err.Error())
	}
	for _, c := range []Class{ClassTransient, ClassWait, ClassPermanent, ClassData, ClassConflict, ClassUnknown} {
		e := &Error{Class: c, Err: base}
		require.Equal(t, c, e.ErrorClass())
		require.Equal(t, c, ClassOf(e))
	}
	// One type: a consumer error is an outbox.SendError and the reverse.
	var se *outbox.SendError
	require.ErrorAs(t, fmt.Errorf("w: %w", Permanent(base)), &se)
	require.Equal(t, ClassPermanent, se.Class)
	var ce *Error
	require.ErrorAs(t, outbox.NewSendError(outbox.ClassPermanent, "no_permission", base), &ce)
	require.Equal(t, "no_permission", ce.Code)
	require.Equal(t, "no_permission", errclass.CodeOf(ce))
}
