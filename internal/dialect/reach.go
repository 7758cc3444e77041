package dialect

import (
	"database/sql"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
)

// What a Start check needs to name a database it cannot reach (package
// startcheck): the server's address and whether the server refused the
// credentials. Both know the drivers, so they live at this seam.

// IsAuthFailure reports whether err is the server refusing the credentials
// (MySQL 1044, 1045, 1698; PostgreSQL class 28).
func IsAuthFailure(err error) bool {
	var me *mysql.MySQLError
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &me):
		return me.Number == 1045 || me.Number == 1044 || me.Number == 1698
	case errors.As(err, &pe):
		return strings.HasPrefix(pe.Code, "28")
	}
	return false
}

// ServerAddr returns the host:port (or socket path) db connects to, from the
// driver's configuration: the go-sql-driver/mysql and pgx stdlib
// connectors are known. database/sql does not expose its connector, so it
// is read by reflection; a driver or version whose layout differs gives ""
// and the error names no address, nothing worse. It never returns user names or passwords, and
// returns "" for a driver it does not know.
func ServerAddr(db *sql.DB) string {
	if db == nil {
		return ""
	}
	c := reflect.ValueOf(db).Elem().FieldByName("connector")
	if !c.IsValid() {
		return ""
	}
	for c.Kind() == reflect.Interface || c.Kind() == reflect.Pointer {
		if c.IsNil() {
			return ""
		}
		c = c.Elem()
	}
	if c.Kind() != reflect.Struct {
		return ""
	}
	// go-sql-driver/mysql: connector{cfg *Config}.
	if cfg := c.FieldByName("cfg"); cfg.IsValid() && cfg.Kind() == reflect.Pointer && !cfg.IsNil() {
		if addr := cfg.Elem().FieldByName("Addr"); addr.IsValid() && addr.Kind() == reflect.String {
			return addr.String()
		}
	}
	// pgx stdlib.OpenDB: connector{pgx.ConnConfig{pgconn.Config{Host, Port}}}.
	if host := c.FieldByName("Host"); host.IsValid() && host.Kind() == reflect.String {
		if port := c.FieldByName("Port"); port.IsValid() && port.CanUint() {
			return net.JoinHostPort(host.String(), strconv.FormatUint(port.Uint(), 10))
		}
	}
	// pgx stdlib via sql.Open("pgx", dsn): driverConnector{name string}.
	if name := c.FieldByName("name"); name.IsValid() && name.Kind() == reflect.String {
		if cfg, err := pgconn.ParseConfig(name.String()); err == nil {
			return net.JoinHostPort(cfg.Host, strconv.FormatUint(uint64(cfg.Port), 10))
		}
	}
	return ""
}
