package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/localenv"
)

// Services are the local services' connection settings (package localenv:
// the same environment variables as the tests and scripts/services.sh env),
// plus extra DSN parameters for every side.
type Services struct {
	localenv.Settings
	// DSNParams are extra DSN parameters ("k=v&k2=v2").
	DSNParams string
}

// LoadServices reads the settings from the environment.
func LoadServices() Services { return Services{Settings: localenv.Load()} }

// DSN returns a go-sql-driver DSN for database name (may be empty), with
// DSNParams applied.
func (s Services) DSN(dbName string) string {
	dsn := s.Settings.DSN(dbName)
	if s.DSNParams == "" {
		return dsn
	}
	c, err := mysql.ParseDSN(dsn)
	if err != nil {
		return dsn
	}
	if q, err := url.ParseQuery(s.DSNParams); err == nil {
		for k := range q {
			switch k {
			case "interpolateParams":
				c.InterpolateParams = q.Get(k) == "true"
			default:
				c.Params[k] = q.Get(k)
			}
		}
	}
	return c.FormatDSN()
}

// Resolver is the explicit, loopback-only name server resolver.
func (s Services) Resolver() primitive.NsResolver { return s.NameServerResolver() }

// getenv returns the environment variable k, or def when it is unset.
func getenv(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func randHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}

// Namer hands out unique topic, group, instance and table names for one run:
// every workload gets fresh ones, so no state leaks between them.
type Namer struct {
	run string
	seq atomic.Int64
}

func NewNamer() *Namer { return &Namer{run: randHex(6)} }

// Run is the run's random id.
func (n *Namer) Run() string { return n.run }

// Name returns "bench_<run>_<kind>_<seq>", valid as a topic, group or
// instance name and as a SQL identifier.
func (n *Namer) Name(kind string) string {
	return fmt.Sprintf("bench_%s_%s_%d", n.run, kind, n.seq.Add(1))
}

// Env is what every workload shares: the services, a fresh database, the
// namer and the run's options.
type Env struct {
	S      Services
	DB     *sqlx.DB
	DBName string
	Names  *Namer
	Opt    Options
	Log    func(format string, args ...any)
	admin  admin.Admin
	root   *sqlx.DB
}

// OpenEnv connects, creates a fresh database for this run and an admin
// client for topics.
func OpenEnv(ctx context.Context, s Services, opt Options, logf func(string, ...any)) (*Env, error) {
	if err := s.CheckLoopback(); err != nil {
		return nil, err
	}
	names := NewNamer()
	root, err := sqlx.Open("mysql", s.DSN(""))
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := root.PingContext(pctx); err != nil {
		_ = root.Close()
		return nil, fmt.Errorf("mysql at %s: %w (start the services with `bash scripts/services.sh up`)", s.MySQLAddr, err)
	}
	dbName := "rmqtx_bench_" + names.Run()
	if _, err := root.ExecContext(pctx, "CREATE DATABASE "+dbName+" CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"); err != nil {
		_ = root.Close()
		return nil, fmt.Errorf("create database: %w", err)
	}
	db, err := sqlx.Open("mysql", s.DSN(dbName))
	if err != nil {
		_ = root.Close()
		return nil, err
	}
	pool := 4*opt.Concurrency + 32
	db.SetMaxOpenConns(pool)
	db.SetMaxIdleConns(pool)
	db.SetConnMaxLifetime(0)
	a, err := admin.NewAdmin(admin.WithResolver(s.Resolver()))
	if err != nil {
		_ = db.Close()
		_ = root.Close()
		return nil, fmt.Errorf("admin client: %w", err)
	}
	return &Env{S: s, DB: db, DBName: dbName, Names: names, Opt: opt, Log: logf, admin: a, root: root}, nil
}

// Close drops the run's database (unless keep) and closes the clients.
func (e *Env) Close(keep bool) {
	_ = e.DB.Close()
	if e.admin != nil {
		_ = e.admin.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if keep {
		e.Log("kept database %s", e.DBName)
	} else if _, err := e.root.ExecContext(ctx, "DROP DATABASE IF EXISTS "+e.DBName); err != nil {
		e.Log("drop database %s: %v", e.DBName, err)
	}
	_ = e.root.Close()
}

// CreateTopic creates topic with queues read/write queues on the broker, so
// routes exist before the first send or subscription.
func (e *Env) CreateTopic(ctx context.Context, topic string, queues int) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := e.admin.CreateTopic(ctx,
		admin.WithTopicCreate(topic),
		admin.WithBrokerAddrCreate(e.S.Broker),
		admin.WithReadQueueNums(queues),
		admin.WithWriteQueueNums(queues),
	); err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	return nil
}

// businessTable creates a business table like a service's orders table: the
// same statement runs on the raw and the rmqtx side. event_id is indexed (the
// raw listener's check looks it up) but not unique: the raw consumer has no
// dedup, and a redelivery must not fail on a duplicate key.
func (e *Env) businessTable(ctx context.Context, name string) error {
	_, err := e.DB.ExecContext(ctx, `CREATE TABLE `+name+` (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  event_id VARCHAR(64) NOT NULL,
  amount BIGINT NOT NULL,
  payload MEDIUMBLOB NOT NULL,
  created_at DATETIME(6) NOT NULL,
  KEY idx_event (event_id)
) ENGINE=InnoDB`)
	if err != nil {
		return fmt.Errorf("create table %s: %w", name, err)
	}
	return nil
}

// insertOrderSQL is the business insert both sides run.
func insertOrderSQL(table string) string {
	return "INSERT INTO " + table + " (event_id, amount, payload, created_at) VALUES (?, ?, ?, UTC_TIMESTAMP(6))"
}

// countRows counts a table's rows.
func (e *Env) countRows(ctx context.Context, table string) (int, error) {
	var n int
	err := e.DB.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+table)
	return n, err
}

// waitFor polls cond every tick until it is true, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout, tick time.Duration, cond func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// LoadAvg returns the 1, 5 and 15 minute load averages ("" if unknown).
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// ReadMachine describes the host.
func ReadMachine(ctx context.Context, db *sqlx.DB, brokerVersion string) Machine {
	m := Machine{
		Cores:         runtime.NumCPU(),
		GOMAXPROCS:    runtime.GOMAXPROCS(0),
		GoVersion:     runtime.Version(),
		OSArch:        runtime.GOOS + "/" + runtime.GOARCH,
		BrokerVersion: brokerVersion,
	}
	m.Hostname, _ = os.Hostname()
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) >= 2 && fs[0] == "MemTotal:" {
				kb, _ := strconv.ParseUint(fs[1], 10, 64)
				m.MemoryBytes = kb * 1024
			}
		}
		_ = f.Close()
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
		_ = f.Close()
	}
	var v string
	if err := db.GetContext(ctx, &v, "SELECT VERSION()"); err == nil {
		m.DBVersion = v
	}
	if err := db.GetContext(ctx, &v, "SELECT @@innodb_flush_log_at_trx_commit"); err == nil {
		m.DBFlush = v
	}
	m.LoadStart = LoadAvg()
	if m.BrokerVersion == "" {
		m.BrokerVersion = "unknown"
	}
	return m
}
