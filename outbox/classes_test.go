package outbox

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
