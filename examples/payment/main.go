// Command payment is rmqtx's payment-success example: a payment callback
// service whose local transaction publishes PaymentSucceeded through the
// transactional producer, three idempotent consumers (points, SMS
// notification through a command outbox, search projection behind a version
// guard), a driver that makes N payments with duplicates, failures and a
// producer restart, and a reconciliation. See README.md.
//
//	go run ./examples/payment [flags]             run the demo end to end
//	go run ./examples/payment reconcile [-db NAME] reconcile a demo database
//
// It runs on MySQL/MariaDB (the default) or, with -engine postgres, on
// PostgreSQL: RMQTX_PG_DSN names the server (scripts/services.sh env).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/localenv"
	"github.com/rmqtx/rmqtx/observe"
)

// demoDBPrefix starts the name of every database a demo run creates.
const demoDBPrefix = "rmqtx_demo_"

// Settings are the connection settings, from the same environment variables
// as the tests (scripts/services.sh env prints them).
type Settings = localenv.Settings

// LoadSettings reads RMQTX_MYSQL_ADDR, RMQTX_MYSQL_USER, RMQTX_MYSQL_PASSWORD,
// RMQTX_NAMESRV and RMQTX_BROKER, with the local services' defaults
// (PostgreSQL's server is RMQTX_PG_DSN: see pgDSN).
func LoadSettings() Settings { return localenv.Load() }

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// newLoggers returns the demo's logger, rmqtx's logger (warnings and up)
// and the RocketMQ client's logger (silent unless verbose: it logs expected
// noise such as missing %RETRY% topics of brand-new groups as warnings).
func newLoggers(stderr io.Writer, verbose bool) (*logrus.Logger, *logrus.Logger, *logrus.Logger) {
	f := &logrus.TextFormatter{FullTimestamp: true, TimestampFormat: "15:04:05.000"}
	l := logrus.New()
	l.SetOutput(stderr)
	l.SetFormatter(f)
	lib := logrus.New()
	lib.SetOutput(stderr)
	lib.SetFormatter(f)
	lib.SetLevel(logrus.WarnLevel)
	client := logrus.New()
	client.SetOutput(stderr)
	client.SetFormatter(f)
	client.SetLevel(logrus.PanicLevel)
	if verbose {
		l.SetLevel(logrus.DebugLevel)
		lib.SetLevel(logrus.InfoLevel)
		client.SetLevel(logrus.WarnLevel)
	}
	return l, lib, client
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "reconcile" {
		return reconcileMain(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("payment", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg RunConfig
	fs.IntVar(&cfg.Payments, "payments", 200, "payments to make")
	fs.IntVar(&cfg.Users, "users", 0, "distinct users (default payments/8, at least 3)")
	fs.Float64Var(&cfg.DupRate, "dup-rate", 0.3, "share of payments whose callback is sent twice more (once concurrently, once late)")
	fs.Float64Var(&cfg.FailRate, "fail-rate", 0.1, "share of events whose first attempt fails in each consumer")
	fs.Float64Var(&cfg.CancelRate, "cancel-rate", 0.1, "extra orders, as a share of -payments, canceled unpaid and then called back late")
	fs.Float64Var(&cfg.RedeliverRate, "redeliver-rate", 0.1, "share of PaymentSucceeded events delivered a second time")
	fs.Float64Var(&cfg.LostSMSRate, "lost-sms-rate", 0.05, "share of SMS whose gateway response is lost (the outbox sends again)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 8, "concurrent callback workers")
	fs.BoolVar(&cfg.NoRestart, "no-restart", false, "do not restart the producer halfway")
	fs.DurationVar(&cfg.Timeout, "timeout", 3*time.Minute, "how long to wait for the consumers to catch up")
	fs.DurationVar(&cfg.FenceAge, "fence-age", 4*time.Second, "txproducer fence age; must fit the broker's check settings (see checkback docs)")
	keep := fs.Int("keep-dbs", 5, "keep this many demo databases (rmqtx_demo_*), dropping older ones; 0 keeps all")
	engineFlag := fs.String("engine", EngineMySQL, "database: mysql (MySQL or MariaDB) or postgres")
	verbose := fs.Bool("v", false, "verbose logs")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	engine, err := parseEngine(*engineFlag)
	if err != nil {
		fmt.Fprintf(stderr, "payment: %v\n", err)
		return 2
	}
	log, lib, client := newLoggers(stderr, *verbose)
	observe.RouteClientLog(client.WithField("component", "rocketmq-client"))
	s := LoadSettings()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	cfg.RunID = time.Now().UTC().Format("20060102_150405") + "_" + randHex(4)
	dbName := demoDBPrefix + cfg.RunID
	root, err := openDB(engine, s, "")
	if err != nil {
		log.WithError(err).Error("open database")
		return 1
	}
	defer root.Close()
	if err := createDemoDB(ctx, root, dbName); err != nil {
		log.WithError(err).Errorf("create database %s at %s (are the services up? `make up`)", dbName, serverAddr(engine, s))
		return 1
	}
	if *keep > 0 {
		pruneDemoDBs(ctx, root, *keep, log)
	}
	db, err := openDB(engine, s, dbName)
	if err != nil {
		log.WithError(err).Error("open database")
		return 1
	}
	defer db.Close()
	db.SetMaxOpenConns(64)
	db.SetMaxIdleConns(64)
	cfg.DB, cfg.NameServers, cfg.Broker = db, []string{s.NameServer}, s.Broker
	cfg.Log, cfg.LibLog = log, lib
	log.WithFields(logrus.Fields{"engine": engine, "database": dbName, "namesrv": s.NameServer, "payments": cfg.Payments}).Info("payment demo starting")
	res, err := Run(ctx, cfg)
	if err != nil {
		log.WithError(err).Error("demo failed")
		return 1
	}
	PrintSummary(stdout, res)
	if !res.Report.OK() || !res.Quiescent || res.Driver.Unexpected > 0 {
		return 1
	}
	return 0
}

func randHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// demoDBs lists the demo databases, oldest first (names sort by time).
func demoDBs(ctx context.Context, root *sqlx.DB) ([]string, error) {
	var names []string
	if err := root.SelectContext(ctx, &names, sqlFor(root.DriverName()).listDemoDBs); err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

// pruneDemoDBs drops all but the newest keep demo databases.
func pruneDemoDBs(ctx context.Context, root *sqlx.DB, keep int, log logrus.FieldLogger) {
	names, err := demoDBs(ctx, root)
	if err != nil || len(names) <= keep {
		return
	}
	for _, n := range names[:len(names)-keep] {
		if !strings.HasPrefix(n, demoDBPrefix) || strings.ContainsAny(n, "`'\" ;") {
			continue
		}
		if err := dropDemoDB(ctx, root, n); err != nil {
			log.WithError(err).Warnf("drop old demo database %s", n)
			continue
		}
		log.Debugf("dropped old demo database %s", n)
	}
}

func reconcileMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("payment reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dbName := fs.String("db", "", "demo database to reconcile (default: the newest rmqtx_demo_*)")
	engineFlag := fs.String("engine", EngineMySQL, "database: mysql (MySQL or MariaDB) or postgres")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	engine, err := parseEngine(*engineFlag)
	if err != nil {
		fmt.Fprintf(stderr, "payment reconcile: %v\n", err)
		return 2
	}
	log, _, _ := newLoggers(stderr, false)
	s := LoadSettings()
	ctx := context.Background()
	if *dbName == "" {
		root, err := openDB(engine, s, "")
		if err != nil {
			log.WithError(err).Error("open database")
			return 1
		}
		names, err := demoDBs(ctx, root)
		_ = root.Close()
		if err != nil {
			log.WithError(err).Error("list demo databases")
			return 1
		}
		if len(names) == 0 {
			log.Error("no demo database (rmqtx_demo_*) found: run the demo first, or pass -db")
			return 1
		}
		*dbName = names[len(names)-1]
	}
	db, err := openDB(engine, s, *dbName)
	if err != nil {
		log.WithError(err).Error("open database")
		return 1
	}
	defer db.Close()
	rep, err := Reconcile(ctx, db, ReconcileTables(nil))
	if err != nil {
		log.WithError(err).Errorf("reconcile %s", *dbName)
		return 1
	}
	fmt.Fprintf(stdout, "database %s\n", *dbName)
	rep.Print(stdout)
	if !rep.OK() {
		return 1
	}
	return 0
}
