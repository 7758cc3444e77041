package main

import (
	"database/sql"
	"errors"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
)

// The DSN picks the database: a postgres:// or postgresql:// URL, or a
// keyword/value string ("host=... dbname=..."), is PostgreSQL through pgx;
// anything else is a go-sql-driver/mysql DSN, as before PostgreSQL came.

// isPostgresDSN reports whether dsn is one of PostgreSQL's two forms.
func isPostgresDSN(dsn string) bool {
	if isPostgresURL(dsn) {
		return true
	}
	// keyword/value: it starts with "word=". A MySQL DSN starts with its
	// user, a ':' or '@' or '/', never with '='.
	s := strings.TrimSpace(dsn)
	i := strings.IndexFunc(s, func(r rune) bool { return !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') })
	return i > 0 && strings.HasPrefix(strings.TrimLeft(s[i:], " \t"), "=")
}

func isPostgresURL(dsn string) bool {
	s := strings.ToLower(strings.TrimSpace(dsn))
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// pgPasswordKeys are the DSN settings that hold a password.
var pgPasswordKeys = map[string]bool{"password": true, "sslpassword": true}

// dbTarget is the database the options name: the driver, what errors and
// config may show (never the password), and how to connect.
type dbTarget struct {
	driver string // "mysql" or "pgx"
	masked string // the DSN with every password replaced by ***
	name   string // database
	addr   string // host:port
	user   string
	open   func() (*sql.DB, error)
}

// target builds the connection settings from the DSN, or for MySQL from the
// RMQTX_MYSQL_* settings; the password goes only to the driver's connector.
func (o *options) target() (*dbTarget, error) {
	if o.dsn != "" && isPostgresDSN(o.dsn) {
		return pgTarget(o.dsn)
	}
	c, err := o.mysqlConfig()
	if err != nil {
		return nil, err
	}
	return &dbTarget{driver: "mysql", masked: maskedDSN(c), name: c.DBName, addr: c.Addr, user: c.User,
		open: func() (*sql.DB, error) {
			conn, err := mysql.NewConnector(c)
			if err != nil {
				return nil, err
			}
			return sql.OpenDB(conn), nil
		}}, nil
}

// pgTarget parses a PostgreSQL DSN with pgx. The session runs in UTC, as
// the MySQL connection's time_zone is '+00:00'.
func pgTarget(dsn string) (*dbTarget, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, usageErr("cannot parse the DSN (want postgres://user:password@host:port/database?param=value, or host=... dbname=...): %s", pgDSNProblem(err))
	}
	if !pgDSNNamesDatabase(dsn) {
		return nil, usageErr("no database: name it in the DSN (postgres://user:password@host:port/DATABASE, or dbname=DATABASE)")
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["timezone"] = "UTC"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "rmqtx"
	}
	return &dbTarget{driver: "pgx", masked: maskPGDSN(dsn), name: cfg.Database,
		addr: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), user: cfg.User,
		open: func() (*sql.DB, error) { return stdlib.OpenDB(*cfg), nil }}, nil
}

// connect opens the pool; nothing is dialled until the first use.
func (t *dbTarget) connect() (*sqlx.DB, error) {
	db, err := t.open()
	if err != nil {
		return nil, err
	}
	return sqlx.NewDb(db, t.driver), nil
}

// pgParseProblems are pgconn's fixed parse messages. Its error text quotes
// the DSN (best-effort redacted) and, for a URL, the url package's error
// quotes it again in clear; only a fixed message is shown.
var pgParseProblems = []string{
	"failed to parse as URL", "failed to parse as keyword/value", "invalid port", "invalid connect_timeout",
	"invalid sslmode", "sslmode is invalid", "invalid require_auth", "invalid sslcertmode", "failed to configure TLS",
	"failed to read service", "failed to read passfile",
	"min_protocol_version cannot be greater than max_protocol_version",
}

func pgDSNProblem(err error) string {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		s := pe.Error()
		for _, p := range pgParseProblems {
			if strings.Contains(s, "`: "+p) {
				return p
			}
		}
	}
	return "malformed"
}

// pgDSNNamesDatabase reports whether the DSN (or PGDATABASE) names the
// database: without one libpq's rules pick the user's name, and the CLI
// does not guess which database to change.
func pgDSNNamesDatabase(dsn string) bool {
	if isPostgresURL(dsn) {
		u, err := url.Parse(strings.TrimSpace(dsn))
		if err != nil {
			return false
		}
		if strings.Trim(u.Path, "/") != "" || u.Query().Get("dbname") != "" {
			return true
		}
	} else {
		for _, kv := range pgKeywordValues(dsn) {
			if kv[0] == "dbname" && kv[1] != "" {
				return true
			}
		}
	}
	return os.Getenv("PGDATABASE") != ""
}

// maskPGDSN returns dsn with its passwords (the URL's user password, and
// password= / sslpassword= settings) replaced by ***.
func maskPGDSN(dsn string) string {
	dsn = strings.TrimSpace(dsn)
	if isPostgresURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "***"
		}
		u.RawQuery = maskQuery(u.RawQuery)
		if _, ok := u.User.Password(); !ok {
			return u.String()
		}
		// Written by hand: url.UserPassword would percent-encode the stars.
		user := url.User(u.User.Username()).String()
		u.User = nil
		scheme, rest, _ := strings.Cut(u.String(), "://")
		return scheme + "://" + user + ":***@" + rest
	}
	var parts []string
	for _, kv := range pgKeywordValues(dsn) {
		v := kv[1]
		if pgPasswordKeys[kv[0]] {
			v = "***"
		}
		parts = append(parts, kv[0]+"="+quotePGValue(v))
	}
	return strings.Join(parts, " ")
}

// maskQuery masks the password settings of a URL query, leaving the rest
// as it was written.
func maskQuery(q string) string {
	if q == "" {
		return q
	}
	parts := strings.Split(q, "&")
	for i, p := range parts {
		k, _, _ := strings.Cut(p, "=")
		if uk, err := url.QueryUnescape(k); err == nil && pgPasswordKeys[uk] {
			parts[i] = k + "=***"
		}
	}
	return strings.Join(parts, "&")
}

func quotePGValue(v string) string {
	if v != "" && !strings.ContainsAny(v, ` '\`) {
		return v
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// pgKeywordValues splits a keyword/value DSN as libpq does: key = value
// pairs separated by spaces, a value in single quotes may hold spaces, a
// backslash escapes the next character. It is lenient: a malformed tail
// ends the list.
func pgKeywordValues(s string) [][2]string {
	var out [][2]string
	i := 0
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i >= len(s) {
			return out
		}
		k := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		key := s[k:i]
		skip()
		if i >= len(s) || s[i] != '=' {
			return out
		}
		i++
		skip()
		var b strings.Builder
		if i < len(s) && s[i] == '\'' {
			i++
			for i < len(s) && s[i] != '\'' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				b.WriteByte(s[i])
				i++
			}
			i++ // the closing quote
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				b.WriteByte(s[i])
				i++
			}
		}
		out = append(out, [2]string{key, b.String()})
	}
}

// pgDSNSecrets returns the passwords a PostgreSQL DSN holds, in every form
// an error could quote them: as written (percent-encoded in a URL) and
// decoded. It does not depend on the DSN being valid.
func pgDSNSecrets(dsn string) []string {
	var out []string
	add := func(v string) {
		if v != "" {
			out = append(out, v)
		}
	}
	if cfg, err := pgx.ParseConfig(dsn); err == nil {
		add(cfg.Password)
	}
	if isPostgresURL(dsn) {
		rest := strings.TrimSpace(dsn)
		rest = rest[strings.Index(rest, "://")+3:]
		// userinfo: up to the last '@' before the path or query.
		auth := rest
		if i := strings.IndexAny(auth, "/?"); i >= 0 {
			auth = auth[:i]
		}
		if i := strings.LastIndex(auth, "@"); i >= 0 {
			if _, pw, ok := strings.Cut(auth[:i], ":"); ok {
				add(pw)
				if d, err := url.PathUnescape(pw); err == nil {
					add(d)
				}
			}
		}
		if i := strings.LastIndex(rest, "@"); i >= 0 {
			// A malformed URL ('/', '?' or '@' inside the password):
			// everything between the first ':' and the last '@' too.
			if _, pw, ok := strings.Cut(rest[:i], ":"); ok {
				add(pw)
			}
		}
		if _, q, ok := strings.Cut(rest, "?"); ok {
			for _, p := range strings.Split(q, "&") {
				k, v, _ := strings.Cut(p, "=")
				if uk, err := url.QueryUnescape(k); err == nil && pgPasswordKeys[uk] {
					add(v)
					if d, err := url.QueryUnescape(v); err == nil {
						add(d)
					}
				}
			}
		}
		return out
	}
	for _, kv := range pgKeywordValues(dsn) {
		if pgPasswordKeys[kv[0]] {
			add(kv[1])
		}
	}
	// As written, in case the value was quoted or escaped, or the string
	// is malformed past it.
	for _, key := range []string{"password", "sslpassword"} {
		s := dsn
		for {
			i := strings.Index(s, key)
			if i < 0 {
				break
			}
			s = s[i+len(key):]
			t := strings.TrimLeft(s, " \t")
			if !strings.HasPrefix(t, "=") {
				continue
			}
			t = strings.TrimLeft(t[1:], " \t")
			if strings.HasPrefix(t, "'") {
				end := strings.LastIndex(t, "'")
				if end > 0 {
					add(t[1:end])
				} else {
					add(t[1:])
				}
			} else if f := strings.Fields(t); len(f) > 0 {
				add(f[0])
			}
		}
	}
	return out
}
