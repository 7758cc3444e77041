// Package testenv gives integration tests a real MariaDB, a real PostgreSQL
// and a real RocketMQ, as started by scripts/services.sh. Each test gets a fresh database and
// unique topic and group names. Missing services make a test FAIL with a
// message that says how to start them; only `go test -short` skips.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/dropdb"
	"github.com/rmqtx/rmqtx/internal/localenv"
)

// HowToStart is printed when a service cannot be reached.
const HowToStart = "start the local services with `make up` (or `scripts/services.sh up`); " +
	"settings come from RMQTX_MYSQL_ADDR, RMQTX_MYSQL_USER, RMQTX_MYSQL_PASSWORD, RMQTX_PG_DSN, RMQTX_NAMESRV and RMQTX_BROKER " +
	"(`eval \"$(scripts/services.sh env)\"`); " +
	"use `go test -short` to run only the unit tests"

// Settings are the connection settings (see package localenv).
type Settings = localenv.Settings

// Load reads the settings from the environment.
func Load() Settings { return localenv.Load() }

var (
	probeOnce sync.Once
	probeErr  error
)

func probe(s Settings) error {
	if err := s.CheckLoopback(); err != nil {
		return fmt.Errorf("testenv: %w", err)
	}
	for _, addr := range []string{s.MySQLAddr, s.NameServer, s.Broker} {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return fmt.Errorf("testenv: cannot reach %s: %w", addr, err)
		}
		_ = c.Close()
	}
	db, err := sqlx.Open("mysql", s.DSN(""))
	if err != nil {
		return fmt.Errorf("testenv: open mysql: %w", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		return fmt.Errorf("testenv: mysql at %s: %w", s.MySQLAddr, err)
	}
	return nil
}

// Integration marks t as an integration test: skipped under -short, and
// failed (not skipped) when the services cannot be reached.
func Integration(t testing.TB) Settings {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: needs MariaDB and RocketMQ; skipped in -short mode")
	}
	rmqlog.Install(nil)
	s := Load()
	probeOnce.Do(func() { probeErr = probe(s) })
	if probeErr != nil {
		t.Fatalf("%v\n%s", probeErr, HowToStart)
	}
	return s
}

// RandSuffix returns n random hex characters.
func RandSuffix(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

var nonWord = regexp.MustCompile(`[^A-Za-z0-9]+`)

// Name returns a unique name for a topic or group, readable in broker logs:
// rmqtx_<kind>_<test>_<random>. RocketMQ allows [A-Za-z0-9_-] up to 127.
func Name(t testing.TB, kind string) string {
	base := nonWord.ReplaceAllString(t.Name(), "_")
	if len(base) > 40 {
		base = base[len(base)-40:]
	}
	return strings.Trim(fmt.Sprintf("rmqtx_%s_%s_%s", kind, base, RandSuffix(8)), "_")
}

// DB returns a connection pool to a fresh MariaDB database that is dropped
// when the test ends; with RMQTX_TEST_DB=postgres, a fresh PostgreSQL
// database instead (PostgresDB), to run a suite not yet written for both
// databases against PostgreSQL by hand. Tests that hold for both databases
// use EachDB; a test that uses DB alone is on one database, which
// testguard fails (see DBMarker) unless a one-db rule says why.
func DB(t testing.TB) *sqlx.DB {
	t.Helper()
	if os.Getenv(EnvTestDB) == DBPostgres {
		return PostgresDB(t)
	}
	return MySQLDB(t)
}

// MySQLDB returns a connection pool to a fresh MariaDB database that is
// dropped when the test ends. It logs DBMarker: a test that calls it and
// never PostgresDB must run on both databases (EachDB) or have a one-db
// rule.
func MySQLDB(t testing.TB) *sqlx.DB {
	t.Helper()
	s := Integration(t)
	name := "rmqtx_t_" + RandSuffix(12)
	root, err := sqlx.Open("mysql", s.DSN(""))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := root.ExecContext(ctx, "CREATE DATABASE "+name+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		_ = root.Close()
		t.Fatalf("testenv: create database: %v\n%s", err, HowToStart)
	}
	markDB(t, DBMySQL, name)
	db, err := sqlx.Open("mysql", s.DSN(name))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	db.SetMaxOpenConns(32)
	db.SetMaxIdleConns(32)
	t.Cleanup(func() {
		_ = db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if os.Getenv("RMQTX_KEEP_DB") == "" {
			if err := dropdb.Drop(ctx, root, name, false); err != nil {
				t.Logf("testenv: %v (the database is left behind)", err)
			}
		} else {
			t.Logf("testenv: kept database %s", name)
		}
		_ = root.Close()
	})
	return db
}

// DBName returns the name of the database db is connected to.
func DBName(t testing.TB, db *sqlx.DB) string {
	t.Helper()
	q := "SELECT DATABASE()"
	if db.DriverName() != "mysql" {
		q = "SELECT current_database()"
	}
	var name string
	if err := db.Get(&name, q); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return name
}

// CreateTopic creates topic on the test broker with the given number of
// queues (4 when queues <= 0), so consumers can subscribe before the first
// send. Auto-create would also work, but it makes routing lazy.
func CreateTopic(t testing.TB, topic string, queues int) {
	t.Helper()
	s := Integration(t)
	if queues <= 0 {
		queues = 4
	}
	a, err := admin.NewAdmin(admin.WithResolver(s.NameServerResolver()))
	if err != nil {
		t.Fatalf("testenv: admin: %v", err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := a.CreateTopic(ctx,
		admin.WithTopicCreate(topic),
		admin.WithBrokerAddrCreate(s.Broker),
		admin.WithReadQueueNums(queues),
		admin.WithWriteQueueNums(queues),
	); err != nil {
		t.Fatalf("testenv: create topic %s: %v", topic, err)
	}
	// The broker registers the new topic with the name server
	// asynchronously; a producer that asks for the route before then gets
	// "route info not found". Wait until the name server has it.
	for {
		mqs, err := a.FetchPublishMessageQueues(ctx, topic)
		if err == nil && len(mqs) >= queues {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("testenv: topic %s not routed by the name server: %v (%d queues)", topic, err, len(mqs))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
