package hasuite

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/suites/internal/testbed"
)

// suite is the run: the HA bed of scripts/services.sh (RMQTX_BROKERS=ha) in
// a run folder of its own, and the summary. The databases are the shared
// ones of testenv: nothing here stops them.
//
// Default ports: below Linux's ephemeral range, clear of the other suites'
// (faultsuite 19876/20911, clustersuite 29876/30911/31011) and of the
// private brokers of package tests (17076-18711). RMQTX_HASUITE_NAMESRV_PORT
// and RMQTX_HASUITE_BROKER_PORT override them (n1 listens 100 above n0, the
// controller 2 above the name server). A load worker pauses 0.5 s after an
// error: a failover is a series of clear errors, not a busy loop, and the
// load resumes soon after the promotion.
var suite = testbed.NewSuite(testbed.SuiteConfig{
	Name:        "hasuite",
	EnvPrefix:   "RMQTX_HASUITE",
	HA:          true,
	NamesrvPort: 27876,
	BrokerPort:  28911,
	ErrorPause:  500 * time.Millisecond,
	Title: func(s *testbed.Suite) string {
		if s.Namesrv == "" {
			return "rmqtx HA suite summary"
		}
		return fmt.Sprintf("rmqtx HA suite summary: one controller-mode replica set (n0 %s, n1 %s), controller embedded in the name server %s",
			s.BrokerA, s.BrokerB, s.Namesrv)
	},
})

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// Bed is one scenario's world (internal/testbed) on the HA bed.
type Bed = testbed.Bed

// newBed builds a scenario's world on db (a fresh database of
// testenv.EachDB's): the scenarios here kill a replica of the one replica
// set, so they run on each database in turn, not in parallel.
func newBed(t *testing.T, name string, db *sqlx.DB) *Bed { return suite.NewBedDB(t, name, db) }

// other is the replica that is not n.
func other(n string) string {
	if n == "n0" {
		return "n1"
	}
	return "n0"
}
