package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// options are the settings every subcommand shares, from flags and the
// environment (flags win).
type options struct {
	dsn          string
	mysqlAddr    string
	mysqlUser    string
	mysqlPass    string
	mysqlDB      string
	nameServer   string
	broker       string
	prefix       string
	json         bool
	redactPrefix int
	now          string
	timeout      time.Duration
}

func envOr(env func(string) string, k, def string) string {
	if v := env(k); v != "" {
		return v
	}
	return def
}

// register adds the shared flags to fs with defaults from the environment.
func (o *options) register(fs *flag.FlagSet, env func(string) string) {
	fs.StringVar(&o.dsn, "dsn", env("RMQTX_DSN"), "MySQL DSN (user:password@tcp(host:port)/db); env RMQTX_DSN")
	fs.StringVar(&o.mysqlAddr, "mysql-addr", envOr(env, "RMQTX_MYSQL_ADDR", "127.0.0.1:3306"), "MySQL address when no DSN; env RMQTX_MYSQL_ADDR")
	fs.StringVar(&o.mysqlUser, "mysql-user", envOr(env, "RMQTX_MYSQL_USER", "root"), "MySQL user; env RMQTX_MYSQL_USER")
	fs.StringVar(&o.mysqlPass, "mysql-password", env("RMQTX_MYSQL_PASSWORD"), "MySQL password; env RMQTX_MYSQL_PASSWORD (prefer the env)")
	fs.StringVar(&o.mysqlDB, "mysql-database", env("RMQTX_MYSQL_DATABASE"), "MySQL database; env RMQTX_MYSQL_DATABASE")
	fs.StringVar(&o.nameServer, "namesrv", env("RMQTX_NAMESRV"), "name server addresses, comma separated; env RMQTX_NAMESRV (no default: always explicit)")
	fs.StringVar(&o.broker, "broker", env("RMQTX_BROKER"), "broker addresses for lookups, comma separated (default: from the name server's route); env RMQTX_BROKER")
	fs.StringVar(&o.prefix, "table-prefix", envOr(env, "RMQTX_TABLE_PREFIX", "rmqtx_"), "table prefix; env RMQTX_TABLE_PREFIX")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	fs.IntVar(&o.redactPrefix, "redact-prefix", inspect.DefaultPrefixLen, "payload bytes shown before masking (0: sizes only)")
	fs.StringVar(&o.now, "now", "", "pretend the current time is this RFC 3339 instant (ages, cutoffs; for reproducible output)")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "overall timeout")
}

var errUsage = errors.New("usage")

func usageErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// mysqlConfig builds the driver config; the password never leaves it except
// to the driver.
func (o *options) mysqlConfig() (*mysql.Config, error) {
	var c *mysql.Config
	if o.dsn != "" {
		var err error
		c, err = mysql.ParseDSN(o.dsn)
		if err != nil {
			// The driver's message does not quote the DSN; ours does not either.
			return nil, usageErr("cannot parse the DSN: %v", err)
		}
	} else {
		c = mysql.NewConfig()
		c.Net, c.Addr, c.User, c.Passwd, c.DBName = "tcp", o.mysqlAddr, o.mysqlUser, o.mysqlPass, o.mysqlDB
	}
	if c.DBName == "" {
		return nil, usageErr("no database: set RMQTX_DSN or RMQTX_MYSQL_DATABASE (or --dsn / --mysql-database)")
	}
	c.ParseTime = true
	c.Loc = time.UTC
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["time_zone"] = "'+00:00'"
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Second
	}
	return c, nil
}

// maskedDSN is the DSN with the password replaced: the only form ever printed.
func maskedDSN(c *mysql.Config) string {
	cp := c.Clone()
	if cp.Passwd != "" {
		cp.Passwd = "***"
	}
	return cp.FormatDSN()
}

func (o *options) nameServers() []string { return splitList(o.nameServer) }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (o *options) validate() error {
	if err := sqlname.ValidatePrefix(o.prefix); err != nil {
		return usageErr("%v", err)
	}
	if o.redactPrefix < 0 {
		return usageErr("--redact-prefix must not be negative")
	}
	if _, err := o.clock(); err != nil {
		return err
	}
	return nil
}

func (o *options) clock() (func() time.Time, error) {
	if o.now == "" {
		return time.Now, nil
	}
	t, err := time.Parse(time.RFC3339Nano, o.now)
	if err != nil {
		return nil, usageErr("--now: %v", err)
	}
	return func() time.Time { return t }, nil
}

// parseTime accepts RFC 3339 or "2006-01-02 15:04:05" (UTC) or a date.
func parseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02 15:04:05", "2006-01-02T15:04:05", "2006-01-02"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, usageErr("cannot parse time %q (want RFC 3339 or 2006-01-02 15:04:05, UTC)", s)
}
