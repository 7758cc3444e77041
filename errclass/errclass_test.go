package errclass_test

import (
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
}

func TestRetryable(t *testing.T) {
	t.Parallel()
	for _, c := range errclass.All {
		want := c == errclass.Transient || c == errclass.Wait || c == errclass.Unknown
		require.Equal(t, want, c.Retryable(), c)
	}
}
