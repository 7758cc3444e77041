package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
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
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/dropdb"
	"github.com/rmqtx/rmqtx/internal/localenv"
)

// Database engines the bench runs on (RMQTX_BENCH_DB; scripts/bench.sh sets
// it from make's DB=).
const (
	engineMySQL    = "mysql"
	enginePostgres = "postgres"
)

// defaultPGDSN is the PostgreSQL server scripts/services.sh starts.
const defaultPGDSN = "postgres://rmqtx:rmqtx@127.0.0.1:5433/rmqtx?sslmode=disable"

// Services are the local services' connection settings (package localenv:
// the same environment variables as the tests and scripts/services.sh env),
// plus extra DSN parameters for every side.
type Services struct {
	localenv.Settings
	// DSNParams are extra DSN parameters ("k=v&k2=v2"): go-sql-driver
	// parameters on MySQL, run-time parameters (SET at connect) on
	// PostgreSQL.
	DSNParams string
	// Engine is engineMySQL (MySQL or MariaDB) or enginePostgres.
	Engine string
	// PGDSN is the PostgreSQL server's DSN (RMQTX_PG_DSN).
	PGDSN string
	// via, when set, is the address of a delay proxy in front of the
	// database (-net-delay): Open and DSN connect there, while DBAddr
	// stays the server's own (its CPU meter finds it by port).
	via string
}

// LoadServices reads the settings from the environment: RMQTX_BENCH_DB
// (mariadb, the default, or postgres) picks the database.
func LoadServices() Services {
	s := Services{Settings: localenv.Load(), Engine: engineMySQL, PGDSN: getenv("RMQTX_PG_DSN", defaultPGDSN)}
	switch strings.ToLower(os.Getenv("RMQTX_BENCH_DB")) {
	case "postgres", "postgresql", "pg":
		s.Engine = enginePostgres
	}
	return s
}

// CheckLoopback refuses a database, name server or broker address that is
// not on loopback.
func (s Services) CheckLoopback() error {
	if err := s.Settings.CheckLoopback(); err != nil {
		return err
	}
	if s.Engine != enginePostgres {
		return nil
	}
	cfg, err := s.pgConfig("")
	if err != nil {
		return err
	}
	if ip := net.ParseIP(cfg.Host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("RMQTX_PG_DSN host %q is not a loopback address; the bench only talks to 127.0.0.1", cfg.Host)
	}
	return nil
}

// DBAddr is the database server's host:port (for its CPU meter).
func (s Services) DBAddr() string {
	if s.Engine == enginePostgres {
		if cfg, err := s.pgConfig(""); err == nil {
			return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
		}
	}
	return s.MySQLAddr
}

// pgConfig is the PostgreSQL connection to database name ("" keeps the
// DSN's), with DSNParams as run-time parameters.
func (s Services) pgConfig(dbName string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(s.PGDSN)
	if err != nil {
		return nil, fmt.Errorf("RMQTX_PG_DSN cannot be parsed")
	}
	if dbName != "" {
		cfg.Database = dbName
	}
	cfg.ConnectTimeout = 5 * time.Second
	if q, err := url.ParseQuery(s.DSNParams); err == nil && s.DSNParams != "" {
		if cfg.RuntimeParams == nil {
			cfg.RuntimeParams = map[string]string{}
		}
		for k := range q {
			cfg.RuntimeParams[k] = q.Get(k)
		}
	}
	return cfg, nil
}

// Open opens database name ("" for the server's default database) on the
// run's engine.
func (s Services) Open(dbName string) (*sqlx.DB, error) {
	if s.Engine != enginePostgres {
		return sqlx.Open("mysql", s.DSN(dbName))
	}
	cfg, err := s.pgConfig(dbName)
	if err != nil {
		return nil, err
	}
	if s.via != "" {
		host, port, err := net.SplitHostPort(s.via)
		if err != nil {
			return nil, fmt.Errorf("database proxy address %q: %w", s.via, err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("database proxy address %q: %w", s.via, err)
		}
		cfg.Host, cfg.Port = host, uint16(p)
		for _, f := range cfg.Fallbacks { // e.g. sslmode=prefer's plain retry: the same server, so the same proxy
			f.Host, f.Port = host, uint16(p)
		}
	}
	return sqlx.NewDb(stdlib.OpenDB(*cfg), "pgx"), nil
}

// DSN returns a go-sql-driver DSN for database name (may be empty), with
// DSNParams applied (MySQL only: workload roundtrips).
func (s Services) DSN(dbName string) string {
	st := s.Settings
	if s.via != "" {
		st.MySQLAddr = s.via
	}
	dsn := st.DSN(dbName)
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
	// Net is the run's delay proxies (-net-delay), nil without.
	Net *netDelay
}

// OpenEnv connects, creates a fresh database for this run and an admin
// client for topics. With -net-delay, the sides' database pool and the name
// server they use (e.S.NameServer, e.S.Resolver) go through delay proxies;
// the run's own set-up (creating and dropping the database, topics through
// the admin client at e.S.Broker) talks to the services directly.
func OpenEnv(ctx context.Context, s Services, opt Options, logf func(string, ...any)) (*Env, error) {
	if err := s.CheckLoopback(); err != nil {
		return nil, err
	}
	names := NewNamer()
	root, err := s.Open("")
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := root.PingContext(pctx); err != nil {
		_ = root.Close()
		return nil, fmt.Errorf("%s at %s: %w (start the services with `bash scripts/services.sh up`)", s.Engine, s.DBAddr(), err)
	}
	dbName := "rmqtx_bench_" + names.Run()
	create := "CREATE DATABASE " + dbName
	if s.Engine == engineMySQL {
		create += " CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
	}
	if _, err := root.ExecContext(pctx, create); err != nil {
		_ = root.Close()
		return nil, fmt.Errorf("create database: %w", err)
	}
	sides := s
	var nd *netDelay
	if opt.NetDelay > 0 {
		if nd, err = startNetDelay(s.DBAddr(), s.NameServer, opt.NetDelay); err != nil {
			_ = root.Close()
			return nil, err
		}
		sides.via, sides.NameServer = nd.db.Addr(), nd.ns.Addr()
		logf("net-delay %s each way: database via %s, name server via %s (brokers via proxies named in its routes)", opt.NetDelay, sides.via, sides.NameServer)
	}
	closeNet := func() {
		if nd != nil {
			nd.Close()
		}
	}
	db, err := sides.Open(dbName)
	if err != nil {
		_ = root.Close()
		closeNet()
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
		closeNet()
		return nil, fmt.Errorf("admin client: %w", err)
	}
	return &Env{S: sides, DB: db, DBName: dbName, Names: names, Opt: opt, Log: logf, admin: a, root: root, Net: nd}, nil
}

// Close drops the run's database (unless keep) and closes the clients.
func (e *Env) Close(keep bool) {
	_ = e.DB.Close()
	if e.admin != nil {
		_ = e.admin.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Neither a client the run left connected nor an autovacuum worker
	// may keep the database (package dropdb).
	if keep {
		e.Log("kept database %s", e.DBName)
	} else if err := dropdb.Drop(ctx, e.root, e.DBName, e.pg()); err != nil {
		e.Log("drop database %s: %v", e.DBName, err)
	}
	_ = e.root.Close()
	if e.Net != nil {
		for _, w := range e.Net.Warnings() {
			e.Log("net-delay: %s", w)
		}
		e.Log("net-delay: %s", e.Net.Summary())
		e.Net.Close()
	}
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

// The raw sides' SQL is user code, written for each database as a service
// would write it: on PostgreSQL its own types, now() as the clock, ON
// CONFLICT for the hand-written dedup, $n placeholders (Rebind). The rmqtx
// sides run the same rmqtx calls on both.

// pg reports whether the run is on PostgreSQL.
func (e *Env) pg() bool { return e.S.Engine == enginePostgres }

// clock is the database's current time, in the raw sides' inserts.
func (e *Env) clock() string {
	if e.pg() {
		return "now()"
	}
	return "UTC_TIMESTAMP(6)"
}

// rawSQL rebinds a raw side's statement for the run's database.
func (e *Env) rawSQL(query string) string { return e.DB.Rebind(query) }

// createTable runs a raw side's DDL for the run's database: one statement
// on MySQL, the table and then its indexes on PostgreSQL.
func (e *Env) createTable(ctx context.Context, name, mysqlDDL string, pgDDL ...string) error {
	stmts := []string{mysqlDDL}
	if e.pg() {
		stmts = pgDDL
	}
	for _, q := range stmts {
		if _, err := e.DB.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("create table %s: %w", name, err)
		}
	}
	return nil
}

// businessTable creates a business table like a service's orders table: the
// same statement runs on the raw and the rmqtx side. event_id is indexed (the
// raw listener's check looks it up) but not unique: the raw consumer has no
// dedup, and a redelivery must not fail on a duplicate key.
func (e *Env) businessTable(ctx context.Context, name string) error {
	return e.createTable(ctx, name, `CREATE TABLE `+name+` (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  event_id VARCHAR(64) NOT NULL,
  amount BIGINT NOT NULL,
  payload MEDIUMBLOB NOT NULL,
  created_at DATETIME(6) NOT NULL,
  KEY idx_event (event_id)
) ENGINE=InnoDB`, `CREATE TABLE `+name+` (
  id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
  event_id VARCHAR(64) NOT NULL,
  amount BIGINT NOT NULL,
  payload BYTEA NOT NULL,
  created_at TIMESTAMPTZ(6) NOT NULL
)`, `CREATE INDEX `+name+`_event ON `+name+` (event_id)`)
}

// insertOrderSQL is the business insert both sides run.
func (e *Env) insertOrderSQL(table string) string {
	return e.rawSQL("INSERT INTO " + table + " (event_id, amount, payload, created_at) VALUES (?, ?, ?, " + e.clock() + ")")
}

// handLogTable creates the raw side's hand-written transaction log.
func (e *Env) handLogTable(ctx context.Context, name string) error {
	return e.createTable(ctx, name, `CREATE TABLE `+name+` (
  event_id VARCHAR(64) NOT NULL PRIMARY KEY, topic VARCHAR(255) NOT NULL, state VARCHAR(16) NOT NULL,
  payload MEDIUMBLOB NULL, created_at DATETIME(6) NOT NULL) ENGINE=InnoDB`, `CREATE TABLE `+name+` (
  event_id VARCHAR(64) NOT NULL PRIMARY KEY, topic VARCHAR(255) NOT NULL, state VARCHAR(16) NOT NULL,
  payload BYTEA NULL, created_at TIMESTAMPTZ(6) NOT NULL)`)
}

// handLogInsertSQL writes a COMMITTED row of the hand-written log (event id,
// topic, payload).
func (e *Env) handLogInsertSQL(table string) string {
	return e.rawSQL("INSERT INTO " + table + " (event_id, topic, state, payload, created_at) VALUES (?, ?, 'COMMITTED', ?, " + e.clock() + ")")
}

// handDedupTable creates the raw consumer's hand-written dedup table.
func (e *Env) handDedupTable(ctx context.Context, name string) error {
	return e.dedupTable(ctx, name, false)
}

// checkedDedupTable creates the dedup table of the hand-written handler
// that does rmqtx's first-delivery work: the row also keeps the event's
// type and its payload's SHA-256, so that a duplicate with another payload
// is told apart from a redelivery.
func (e *Env) checkedDedupTable(ctx context.Context, name string) error {
	return e.dedupTable(ctx, name, true)
}

// dedupTable creates a hand-written dedup table keyed by (group, event id),
// with the event type and payload hash columns when checked.
func (e *Env) dedupTable(ctx context.Context, name string, checked bool) error {
	cols := ""
	if checked {
		cols = "\n  event_type VARCHAR(128) NOT NULL,\n  request_hash CHAR(64) NOT NULL,"
	}
	return e.createTable(ctx, name, `CREATE TABLE `+name+` (
  consumer_group VARCHAR(255) NOT NULL,
  event_id VARCHAR(64) NOT NULL,`+cols+`
  created_at DATETIME(6) NOT NULL,
  PRIMARY KEY (consumer_group, event_id)
) ENGINE=InnoDB`, `CREATE TABLE `+name+` (
  consumer_group VARCHAR(255) NOT NULL,
  event_id VARCHAR(64) NOT NULL,`+cols+`
  created_at TIMESTAMPTZ(6) NOT NULL,
  PRIMARY KEY (consumer_group, event_id)
)`)
}

// handDedupInsertSQL inserts the dedup row (group, event id) unless it is
// there: 1 row affected for a first delivery, 0 for a duplicate.
func (e *Env) handDedupInsertSQL(table string) string {
	if e.pg() {
		return e.rawSQL("INSERT INTO " + table + " (consumer_group, event_id, created_at) VALUES (?, ?, now()) ON CONFLICT DO NOTHING")
	}
	return "INSERT IGNORE INTO " + table + " (consumer_group, event_id, created_at) VALUES (?, ?, UTC_TIMESTAMP(6))"
}

// checkedDedupSQL returns the checked handler's two statements: the dedup
// row unless it is there (1 row affected for a first delivery, 0 for a
// duplicate), and the locking read of a duplicate's stored hash.
func (e *Env) checkedDedupSQL(table string) (insert, storedHash string) {
	if e.pg() {
		return e.rawSQL("INSERT INTO " + table + " (consumer_group, event_id, event_type, request_hash, created_at) VALUES (?, ?, ?, ?, now()) ON CONFLICT DO NOTHING"),
			e.rawSQL("SELECT request_hash FROM " + table + " WHERE consumer_group = ? AND event_id = ? FOR SHARE")
	}
	return "INSERT IGNORE INTO " + table + " (consumer_group, event_id, event_type, request_hash, created_at) VALUES (?, ?, ?, ?, UTC_TIMESTAMP(6))",
		"SELECT request_hash FROM " + table + " WHERE consumer_group = ? AND event_id = ? LOCK IN SHARE MODE"
}

// rowDedupSQL is checkedDedupSQL for log, a table with rmqtx's consume-log
// schema: the insert writes the row the Processor writes for a first
// delivery (its columns, its values, the database clock for both times);
// only the conflict is handled as the checked handler handles it.
func (e *Env) rowDedupSQL(log string) (insert, storedHash string) {
	now := dialect.Must(e.DB).Now()
	cols, vals := "consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at",
		"?, ?, ?, ?, '"+consumer.StatusApplied+"', 0, "+now+", "+now
	if e.pg() {
		return e.rawSQL("INSERT INTO " + log + " (" + cols + ") VALUES (" + vals + ") ON CONFLICT DO NOTHING"),
			e.rawSQL("SELECT request_hash FROM " + log + " WHERE consumer_group = ? AND event_id = ? FOR SHARE")
	}
	return "INSERT IGNORE INTO " + log + " (" + cols + ") VALUES (" + vals + ")",
		"SELECT request_hash FROM " + log + " WHERE consumer_group = ? AND event_id = ? LOCK IN SHARE MODE"
}

// consumeLogShape describes how a consume log's rows are filled, apart
// from their keys, hashes and times: the lowest and highest value of each
// column a first delivery fills alike, and how many rows have a hash that
// is not 64 characters or a result reference.
func (e *Env) consumeLogShape(ctx context.Context, table string) (string, error) {
	var vals []string
	for _, c := range []string{"event_type", "status", "retry_count"} {
		vals = append(vals, "MIN("+c+")", "MAX("+c+")")
	}
	vals = append(vals, "COALESCE(SUM(CASE WHEN LENGTH(request_hash) = 64 THEN 0 ELSE 1 END), -1)",
		"COUNT(result_ref)", "COALESCE(SUM(CASE WHEN first_received_at = updated_at THEN 0 ELSE 1 END), -1)")
	return e.shape(ctx, "SELECT "+strings.Join(vals, ", ")+" FROM "+table)
}

// shape runs q, an aggregate query of one row, and returns its values,
// each as text, joined by spaces: two tables filled alike give the same.
func (e *Env) shape(ctx context.Context, q string) (string, error) {
	got, err := e.DB.QueryRowxContext(ctx, q).SliceScan()
	if err != nil {
		return "", err
	}
	out := make([]string, len(got))
	for i, v := range got {
		if b, ok := v.([]byte); ok {
			v = string(b)
		}
		out[i] = fmt.Sprint(v)
	}
	return strings.Join(out, " "), nil
}

// checkedHashMismatches counts the checked handler's dedup rows that no
// business row of the same event matches with a payload whose SHA-256,
// computed by the database, is the stored hash (every round applies the
// same events again, so one match per row is looked for, not every pair).
func (e *Env) checkedHashMismatches(ctx context.Context, dedup, business string) (int, error) {
	// Compared as bytes on MariaDB: rmqtx's consume log keeps the hash in an
	// ASCII column, SHA2 returns the connection's character set.
	sum, stored := "CAST(LOWER(SHA2(b.payload, 256)) AS BINARY)", "CAST(d.request_hash AS BINARY)"
	if e.pg() {
		sum, stored = "encode(sha256(b.payload), 'hex')", "d.request_hash"
	}
	var n int
	err := e.DB.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+dedup+" d WHERE NOT EXISTS (SELECT 1 FROM "+business+
		" b WHERE b.event_id = d.event_id AND "+sum+" = "+stored+")")
	return n, err
}

// txlogShape describes how a transaction log's rows are filled, apart
// from their ids and times: the lowest and highest value of each column
// that a run fills alike, the range of the payload's and the properties'
// lengths, and how many rows lack a hash, a payload or properties, or
// differ from a plain Send's row (a recovery column or a business key set,
// keys other than the id).
func (e *Env) txlogShape(ctx context.Context, table string) (string, error) {
	var vals []string
	for _, c := range []string{"producer_group", "topic", "tags", "event_type", "state", "resolved_by"} {
		vals = append(vals, "MIN("+c+")", "MAX("+c+")")
	}
	for _, x := range []string{
		"SUM(CASE WHEN LENGTH(payload_hash) = 64 THEN 0 ELSE 1 END)", "SUM(CASE WHEN payload IS NULL THEN 1 ELSE 0 END)",
		"SUM(CASE WHEN properties IS NULL THEN 1 ELSE 0 END)",
		"SUM(CASE WHEN recovered_at IS NULL AND recovery_decision IS NULL AND recovery_note IS NULL AND business_key = '' AND msg_keys = event_id THEN 0 ELSE 1 END)",
		"MIN(LENGTH(payload))", "MAX(LENGTH(payload))", "MIN(LENGTH(properties))", "MAX(LENGTH(properties))",
	} {
		vals = append(vals, "COALESCE("+x+", -1)")
	}
	return e.shape(ctx, "SELECT "+strings.Join(vals, ", ")+" FROM "+table)
}

// dropTxlogIndexes drops the txlog's two secondary indexes (the
// -txlog-no-index experiment).
func (e *Env) dropTxlogIndexes(ctx context.Context, t string) error {
	q := "ALTER TABLE " + t + " DROP INDEX " + t + "_state_resolved, DROP INDEX " + t + "_group_created"
	if e.pg() {
		q = "DROP INDEX " + t + "_state_resolved, " + t + "_group_created"
	}
	_, err := e.DB.ExecContext(ctx, q)
	return err
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
	if db.DriverName() == "pgx" {
		if err := db.GetContext(ctx, &v, "SELECT 'PostgreSQL ' || current_setting('server_version')"); err == nil {
			m.DBVersion = v
		}
		// PostgreSQL's durability settings, in the field MySQL's flush
		// setting fills (the test bed: fsync=off, synchronous_commit=on).
		if err := db.GetContext(ctx, &v, "SELECT 'fsync=' || current_setting('fsync') || ' synchronous_commit=' || current_setting('synchronous_commit')"); err == nil {
			m.DBFlush = v
		}
	} else {
		if err := db.GetContext(ctx, &v, "SELECT VERSION()"); err == nil {
			m.DBVersion = v
		}
		if err := db.GetContext(ctx, &v, "SELECT @@innodb_flush_log_at_trx_commit"); err == nil {
			m.DBFlush = v
		}
	}
	m.LoadStart = LoadAvg()
	if m.BrokerVersion == "" {
		m.BrokerVersion = "unknown"
	}
	return m
}
