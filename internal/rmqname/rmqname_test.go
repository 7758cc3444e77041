package rmqname

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNames(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"orders", "%RETRY%g", "a|b", "x_y-z", strings.Repeat("a", 127)} {
		require.NoError(t, Topic(ok), ok)
	}
	for _, bad := range []string{"", "has space", "dot.ted", strings.Repeat("a", 128), "ü"} {
		require.Error(t, Topic(bad), bad)
	}
	require.NoError(t, NameServers([]string{"127.0.0.1:9876", "localhost:9877"}))
	require.ErrorContains(t, NameServers(nil), "is required")
	require.ErrorContains(t, NameServers([]string{"127.0.0.1"}), "want host:port")
}
