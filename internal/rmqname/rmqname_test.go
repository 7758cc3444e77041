package rmqname

import (
	"regexp"
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

// ruleRE is RocketMQ's rule as TopicValidator writes it; ValidTopic is a
// loop for speed and must agree with it on every input.
var ruleRE = regexp.MustCompile(`^[%|a-zA-Z0-9_-]{1,127}$`)

func FuzzValidTopicIsTheRule(f *testing.F) {
	for _, s := range []string{"orders", "%RETRY%g", "a|b", "", "a\n", "a.b", "ü", strings.Repeat("a", 127), strings.Repeat("a", 128)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidTopic(s), ruleRE.MatchString(s); got != want {
			t.Fatalf("ValidTopic(%q) = %t, the rule says %t", s, got, want)
		}
	})
}
