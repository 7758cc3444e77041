//go:build failpoints

package clustersuite

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/suites/internal/testbed"
)

// suite is the cluster suite's test bed: a private MariaDB, PostgreSQL, name
// server and two master brokers (scripts/services.sh with RMQTX_BROKERS=2;
// ports 23307, 25433, 29876, 30911 and 31011, overridable with
// RMQTX_CLUSTERSUITE_MYSQL_PORT, _PG_PORT, _NAMESRV_PORT and _BROKER_PORT;
// broker-b listens 100 above broker-a, each uses port-2 and port+1 too). Flags after -args: -summary-file PATH,
// -run-dir DIR and -keep-services.
var suite = testbed.NewSuite(testbed.SuiteConfig{
	Name: "clustersuite", EnvPrefix: "RMQTX_CLUSTERSUITE",
	MySQLPort: 23307, PGPort: 25433, NamesrvPort: 29876, BrokerPort: 30911, Brokers: 2,
	DBConns: 48, ErrorPause: 500 * time.Millisecond,
	Title: func(s *testbed.Suite) string {
		return fmt.Sprintf("rmqtx cluster suite summary: two brokers (broker-a %s, broker-b %s), one name server", s.BrokerA, s.BrokerB)
	},
})

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }
