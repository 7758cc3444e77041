// Package localenv reads the connection settings of rmqtx's local services
// (scripts/services.sh) from the environment, for tests, the benchmark and
// the examples. The defaults match the scripts; every address must be on
// loopback, because nothing here ever talks to another host.
package localenv

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/rmqtx/rmqtx/internal/broker"
)

// Settings are the connection settings.
type Settings struct {
	MySQLAddr     string // RMQTX_MYSQL_ADDR, default 127.0.0.1:3307
	MySQLUser     string // RMQTX_MYSQL_USER, default rmqtx
	MySQLPassword string // RMQTX_MYSQL_PASSWORD, default rmqtx
	MySQLDatabase string // RMQTX_MYSQL_DATABASE, default rmqtx
	NameServer    string // RMQTX_NAMESRV, default 127.0.0.1:9876
	Broker        string // RMQTX_BROKER, default 127.0.0.1:10911
}

func env(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Load reads the settings from the environment.
func Load() Settings {
	return Settings{
		MySQLAddr:     env("RMQTX_MYSQL_ADDR", "127.0.0.1:3307"),
		MySQLUser:     env("RMQTX_MYSQL_USER", "rmqtx"),
		MySQLPassword: env("RMQTX_MYSQL_PASSWORD", "rmqtx"),
		MySQLDatabase: env("RMQTX_MYSQL_DATABASE", "rmqtx"),
		NameServer:    env("RMQTX_NAMESRV", "127.0.0.1:9876"),
		Broker:        env("RMQTX_BROKER", "127.0.0.1:10911"),
	}
}

// DSN returns a go-sql-driver DSN for database name (may be empty): UTC,
// parsed times, short connect timeout.
func (s Settings) DSN(dbName string) string {
	c := mysql.NewConfig()
	c.User = s.MySQLUser
	c.Passwd = s.MySQLPassword
	c.Net = "tcp"
	c.Addr = s.MySQLAddr
	c.DBName = dbName
	c.ParseTime = true
	c.Loc = time.UTC
	c.Params = map[string]string{"time_zone": "'+00:00'"}
	c.Timeout = 5 * time.Second
	c.ReadTimeout = 60 * time.Second
	c.WriteTimeout = 60 * time.Second
	return c.FormatDSN()
}

// NameServerResolver returns the explicit name server resolver; the
// client's default (an HTTP lookup off this machine) is never used.
func (s Settings) NameServerResolver() broker.NsResolver {
	return broker.NameServers([]string{s.NameServer})
}

// CheckLoopback refuses any address that is not on loopback.
func (s Settings) CheckLoopback() error {
	for _, addr := range []string{s.MySQLAddr, s.NameServer, s.Broker} {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("localenv: bad address %q: %w", addr, err)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return fmt.Errorf("localenv: %s is not a loopback address; rmqtx's local tools only talk to 127.0.0.1", addr)
		}
	}
	return nil
}
