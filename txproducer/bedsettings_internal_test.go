package txproducer

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The project's own broker (scripts/services.sh's defaults, and
// scripts/rocketmq/broker.conf that docker/ mounts) fits the default
// FenceAge: a default Start against `make up`'s broker warns of nothing
// (issue 31). The settings are read from the files, so that lowering
// transactionCheckMax there again fails here, without a broker.
func TestDefaultFenceAgeFitsTestBed(t *testing.T) {
	t.Parallel()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "scripts", name))
		require.NoError(t, err)
		return string(b)
	}
	script := read("services.sh")
	scriptDefault := func(name string) string {
		m := regexp.MustCompile(`(?m)^` + name + `=\$\{RMQTX_` + name + `:-([0-9]+)\}$`).FindStringSubmatch(script)
		require.NotNil(t, m, "services.sh has no numeric default for %s", name)
		return m[1]
	}
	fromScript := map[string]string{
		"transactionTimeOut":       scriptDefault("TX_TIMEOUT_MS"),
		"transactionCheckInterval": scriptDefault("TX_CHECK_INTERVAL_MS"),
		"transactionCheckMax":      scriptDefault("TX_CHECK_MAX"),
	}
	fromConf := map[string]string{}
	for _, line := range strings.Split(read(filepath.Join("rocketmq", "broker.conf")), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok && !strings.HasPrefix(k, "#") {
			fromConf[k] = v
		}
	}
	for name, conf := range map[string]map[string]string{"services.sh": fromScript, "broker.conf": fromConf} {
		e, err := fenceAgeAgainst("127.0.0.1:10911", DefaultFenceAge, conf)
		require.NoError(t, err, name)
		require.Nil(t, e, "%s: the default FenceAge must fit the test bed's broker", name)
	}
}
