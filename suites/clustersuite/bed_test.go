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

// eachDB runs body once per database server as parallel subtests named
// after the server ("mysql", "postgres"), each with a bed of its own, so
// every cluster scenario proves the invariants on both and the summary
// shows each. r is shared by the two subtests: a broker kill runs once
// (r.Step) and hits both beds.
func eachDB(t *testing.T, name string, body func(t *testing.T, b *bed, r *testbed.Rendezvous)) {
	t.Helper()
	suite.EachDB(t, name, func(t *testing.T, b *testbed.Bed, r *testbed.Rendezvous) { body(t, &bed{b}, r) })
}

// shared runs step once for the beds of every database (r.Step), failing
// t when it failed in the other database's subtest.
func shared(t *testing.T, r *testbed.Rendezvous, what string, step func()) {
	t.Helper()
	if !r.Step(step) {
		t.Fatalf("the shared step %q failed in the other database's subtest", what)
	}
}

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
