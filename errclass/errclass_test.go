package errclass_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"
)

type classified struct{ c errclass.Class }

func (e classified) Error() string              { return "classified " + string(e.c) }
func (e classified) ErrorClass() errclass.Class { return e.c }

func TestOfFindsTheOutermostClass(t *testing.T) {
	t.Parallel()
	_, ok := errclass.Of(errors.New("plain"))
	require.False(t, ok)
	inner := fmt.Errorf("wrapped: %w", classified{errclass.Data})
	c, ok := errclass.Of(inner)
	require.True(t, ok)
	require.Equal(t, errclass.Data, c)
	outer := classified{errclass.Wait}
	c, _ = errclass.Of(fmt.Errorf("x: %w", errors.Join(outer, inner)))
	require.Equal(t, errclass.Wait, c)
	_, ok = errclass.Of(classified{"bogus"})
	require.False(t, ok, "a name outside the vocabulary is no class")
	c, ok = errclass.Of(fmt.Errorf("%w: %w", classified{"bogus"}, classified{errclass.Permanent}))
	require.True(t, ok, "an invalid class is skipped, not the end of the search")
	require.Equal(t, errclass.Permanent, c)
}

// TestClassOfFallsBackToUnknown: the one ClassOf; an error nobody
// classified is Unknown (what the class means), nil has no class.
func TestClassOfFallsBackToUnknown(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	cases := []struct {
		err   error
		class errclass.Class
		code  string
	}{
		{nil, "", ""},
		{base, errclass.Unknown, "unknown"},
		{context.DeadlineExceeded, errclass.Unknown, "unknown"},
		{classified{"bogus"}, errclass.Unknown, "unknown"},
		{errclass.New(errclass.Permanent, "no_permission", base), errclass.Permanent, "no_permission"},
		{errclass.New(errclass.Transient, "", base), errclass.Transient, "transient"},
		{fmt.Errorf("w: %w", errclass.New(errclass.Data, "bad_json", base)), errclass.Data, "bad_json"},
		{classified{errclass.Wait}, errclass.Wait, "wait"},
		// the outermost class decides, and so does its code
		{errclass.New(errclass.Transient, "", errclass.New(errclass.Permanent, "p", base)), errclass.Transient, "transient"},
		{classified{errclass.Conflict}, errclass.Conflict, "conflict"},
	}
	for _, c := range cases {
		require.Equal(t, c.class, errclass.ClassOf(c.err), fmt.Sprint(c.err))
		require.Equal(t, c.code, errclass.CodeOf(c.err), fmt.Sprint(c.err))
	}
}

func TestError(t *testing.T) {
	t.Parallel()
	base := errors.New("boom")
	require.Nil(t, errclass.New(errclass.Permanent, "", nil), "New passes a success through")
	w := errclass.Wrap(errclass.Wait, "", nil)
	require.Equal(t, "wait", w.Error(), "Wrap never returns nil")
	require.Equal(t, errclass.Wait, errclass.ClassOf(w))

	err := fmt.Errorf("ctx: %w", errclass.New(errclass.Permanent, "http_400", base))
	require.Equal(t, "ctx: boom", err.Error(), "the class is not in the text")
	require.ErrorIs(t, err, base)
	var e *errclass.Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, errclass.Permanent, e.ErrorClass())
	require.Equal(t, "http_400", e.ErrorCode())
	require.Equal(t, "unknown", (&errclass.Error{Class: errclass.Unknown}).ErrorCode())
	require.Equal(t, "transient error (x)", (&errclass.Error{Class: errclass.Transient, Code: "x"}).Error())
	require.Equal(t, "transient error", (&errclass.Error{Class: errclass.Transient}).Error())

	f, ok := errclass.Find(errors.Join(base, err))
	require.True(t, ok)
	require.Same(t, e, f)
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	for _, c := range errclass.All {
		want := c == errclass.Transient || c == errclass.Wait || c == errclass.Unknown
		require.Equal(t, want, c.Retryable(), c)
	}
}
