//go:build failpoints

package faultsuite

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/rmqtx/rmqtx/suites/internal/testbed"
)

// Flags. Zero values pick the CI defaults, or the soak defaults with -soak.
// The test bed adds -run-dir, -summary-file and -keep-services.
var (
	soakFlag      = flag.Bool("soak", false, "soak mode: larger defaults for -tx, -crashes-per-window and -storm-events")
	txFlag        = flag.Int("tx", 0, "minimum transactions attempted by the load phases, split between the crash matrix (1/2) and the two restarts (1/4 each); default 400, soak 10000")
	crashesFlag   = flag.Int("crashes-per-window", 0, "SIGKILLed subprocesses per failpoint window; default 3, soak 20")
	stormFlag     = flag.Int("storm-events", 0, "events in the duplicate storm (each sent 4 times); default 100, soak 2000")
	workersFlag   = flag.Int("workers", 4, "concurrent producer goroutines in the load phases")
	childWatchdog = 90 * time.Second
)

// suite is the fault suite's test bed: a private MariaDB, PostgreSQL, name
// server and broker (ports 13307, 15433, 19876 and 20911, overridable with
// RMQTX_FAULTSUITE_MYSQL_PORT, _PG_PORT, _NAMESRV_PORT and _BROKER_PORT; the
// broker uses 20909 and 20912 too).
var suite = testbed.NewSuite(testbed.SuiteConfig{
	Name: "faultsuite", EnvPrefix: "RMQTX_FAULTSUITE",
	MySQLPort: 13307, PGPort: 15433, NamesrvPort: 19876, BrokerPort: 20911, Brokers: 1,
	DBConns: 64, ErrorPause: time.Second,
	Title: func(*testbed.Suite) string {
		mode := "CI"
		if *soakFlag {
			mode = "soak"
		}
		return fmt.Sprintf("rmqtx fault suite summary: %s mode (tx=%d crashes-per-window=%d storm-events=%d workers=%d)",
			mode, cfg.tx, cfg.crashes, cfg.storm, cfg.workers)
	},
})

type params struct {
	tx, crashes, storm, workers int
}

func loadParams() params {
	p := params{tx: 400, crashes: 3, storm: 100, workers: *workersFlag}
	if *soakFlag {
		p = params{tx: 10000, crashes: 20, storm: 2000, workers: *workersFlag}
	}
	if *txFlag > 0 {
		p.tx = *txFlag
	}
	if *crashesFlag > 0 {
		p.crashes = *crashesFlag
	}
	if *stormFlag > 0 {
		p.storm = *stormFlag
	}
	if p.workers <= 0 {
		p.workers = 4
	}
	return p
}

var cfg params

func TestMain(m *testing.M) {
	flag.Parse()
	cfg = loadParams()
	os.Exit(suite.Main(m))
}
