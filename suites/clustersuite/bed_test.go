//go:build failpoints

package clustersuite

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
)

// bed is one scenario's world on the cluster (internal/testbed: a topic
// with queues on both brokers), with the cluster suite's own helpers as
// methods.
type bed struct{ *testbed.Bed }

func newBed(t *testing.T, name string) *bed { return &bed{suite.NewBed(t, name)} }

// brokerName names the broker at addr as services.sh does.
func brokerName(addr string) string { return suite.BrokerName(addr) }

// orderViolations lists the aggregates whose effects were not applied in
// strictly increasing version order (effects ids are the order of commit).
func (b *bed) orderViolations(t *testing.T) []string {
	t.Helper()
	var rows []struct {
		Agg string `db:"agg"`
		Ver int64  `db:"ver"`
	}
	require.NoError(t, b.DB.Select(&rows, "SELECT agg, ver FROM effects WHERE agg <> '' ORDER BY id"))
	last := map[string]int64{}
	var out []string
	for _, r := range rows {
		if r.Ver <= last[r.Agg] {
			out = append(out, fmt.Sprintf("%s: version %d after %d", r.Agg, r.Ver, last[r.Agg]))
		}
		last[r.Agg] = r.Ver
	}
	return out
}

// lookup asks both brokers' indexes: the operator's view (package inspect),
// which the cluster tests use to tell which broker holds an event.
func lookup() inspect.RemotingLookup {
	return inspect.RemotingLookup{NameServers: []string{testenv.Load().NameServer}, Timeout: 5 * time.Second}
}

// brokersHolding returns the names of the brokers whose index holds id in
// topic (the half topic, the discard topic, or an ordinary topic).
func brokersHolding(ctx context.Context, topic, id string) (map[string]bool, error) {
	ms, err := lookup().QueryByKey(ctx, topic, id, 32)
	out := map[string]bool{}
	for _, m := range ms {
		out[brokerName(m.Broker)] = true
	}
	return out, err
}
