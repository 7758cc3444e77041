package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/schema"
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
	showPayload  bool
	now          string
	timeout      time.Duration

	env   func(string) string
	binds []envBind
}

// envBind ties a flag to the environment variable that fills it when the
// flag is not given.
type envBind struct {
	flag, env string
	dst       *string
}

// register adds the shared flags to fs. Environment values are applied
// after parsing (see parse), never as flag defaults: the flag package prints
// defaults in -h and on every usage error, and RMQTX_DSN and
// RMQTX_MYSQL_PASSWORD hold a password. Help says only whether a variable is
// set, never its value.
func (o *options) register(fs *flag.FlagSet, env func(string) string) {
	o.env = env
	str := func(dst *string, name, def, envName, usage string) {
		if env(envName) != "" {
			usage += " [" + envName + " is set]"
		}
		fs.StringVar(dst, name, def, usage)
		o.binds = append(o.binds, envBind{name, envName, dst})
	}
	str(&o.dsn, "dsn", "", "RMQTX_DSN", "database DSN: MySQL user:password@tcp(host:port)/db, or PostgreSQL postgres://user:password@host:port/db (or host=... dbname=...); env RMQTX_DSN (prefer the env: arguments are visible to other users)")
	str(&o.mysqlAddr, "mysql-addr", "127.0.0.1:3306", "RMQTX_MYSQL_ADDR", "MySQL address when no DSN; env RMQTX_MYSQL_ADDR")
	str(&o.mysqlUser, "mysql-user", "root", "RMQTX_MYSQL_USER", "MySQL user; env RMQTX_MYSQL_USER")
	str(&o.mysqlPass, "mysql-password", "", "RMQTX_MYSQL_PASSWORD", "MySQL password; env RMQTX_MYSQL_PASSWORD (prefer the env)")
	str(&o.mysqlDB, "mysql-database", "", "RMQTX_MYSQL_DATABASE", "MySQL database; env RMQTX_MYSQL_DATABASE")
	str(&o.nameServer, "namesrv", "", "RMQTX_NAMESRV", "name server addresses, comma separated; env RMQTX_NAMESRV (no default: always explicit)")
	str(&o.broker, "broker", "", "RMQTX_BROKER", "broker addresses for lookups, comma separated (default: from the name server's route); env RMQTX_BROKER")
	str(&o.prefix, "table-prefix", schema.DefaultPrefix, "RMQTX_TABLE_PREFIX", "table prefix; env RMQTX_TABLE_PREFIX")
	fs.BoolVar(&o.json, "json", false, "print JSON instead of a table")
	fs.IntVar(&o.redactPrefix, "redact-prefix", 0, "RISKY: show this many leading payload bytes (default 0: payload sizes only)")
	fs.BoolVar(&o.showPayload, "show-payload", false, "RISKY: show payloads in clear (card numbers, addresses, ... reach your screen and logs)")
	fs.StringVar(&o.now, "now", "", "pretend the current time is this RFC 3339 instant (ages, cutoffs; for reproducible output)")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "overall timeout")
}

// parse parses fs (flags and positional arguments in any order), then fills
// the flags not given from the environment. The flag package's own output
// (help, and the usage after a bad flag) goes to fs's output; its copy of the
// error does not, since run prints the error, scrubbed of secrets.
func (o *options) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	out := fs.Output()
	var buf bytes.Buffer
	fs.SetOutput(&buf)
	pos, err := parse(fs, args)
	fs.SetOutput(out)
	text := buf.String()
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		// The flag package printed the error line first, then the usage.
		if _, rest, ok := strings.Cut(text, "\n"); ok {
			text = rest
		}
	}
	fmt.Fprint(out, text)
	if err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, b := range o.binds {
		if v := o.env(b.env); v != "" && !set[b.flag] {
			*b.dst = v
		}
	}
	return pos, nil
}

// payloadRedactor is what the operator chose to see of payloads: sizes only
// unless they opted out.
func (o *options) payloadRedactor() inspect.Redactor {
	switch {
	case o.showPayload:
		return inspect.Clear()
	case o.redactPrefix > 0:
		return inspect.ShowPrefix(o.redactPrefix)
	}
	return inspect.Hidden()
}

// payloadMode describes payloadRedactor for config.
func (o *options) payloadMode() string {
	switch {
	case o.showPayload:
		return "shown in clear (--show-payload)"
	case o.redactPrefix > 0:
		return fmt.Sprintf("first %d bytes shown (--redact-prefix)", o.redactPrefix)
	}
	return "hidden (sizes only)"
}

var errUsage = errors.New("usage")

func usageErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// mysqlConfig builds the MySQL driver config; the password never leaves it
// except to the driver.
func (o *options) mysqlConfig() (*mysql.Config, error) {
	var c *mysql.Config
	if o.dsn != "" {
		var err error
		c, err = mysql.ParseDSN(o.dsn)
		if err != nil {
			return nil, usageErr("cannot parse the DSN (want user:password@tcp(host:port)/database?param=value): %s", dsnProblem(err))
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

// dsnProblem is the driver's parse error if it is one of its fixed texts.
// Its other errors quote parts of the DSN (a malformed DSN without "@" has
// "user:password" quoted as the network name), so they are not shown.
func dsnProblem(err error) string {
	if s := err.Error(); strings.HasPrefix(s, "invalid DSN: ") {
		return strings.TrimPrefix(s, "invalid DSN: ")
	}
	return "malformed"
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
