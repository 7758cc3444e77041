package main

import (
	"sort"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// secrets are the passwords the CLI was handed, from the environment and
// the command line. Nothing the CLI builds contains them (flags have no
// environment defaults, the DSN is printed masked, the driver gets a
// connector, not a DSN); scrubbing error texts with them is the second line
// for what it does not build itself: driver and flag package messages.
type secrets []string

// secretFlags are the flags whose values are, or contain, a password.
var secretFlags = map[string]bool{"dsn": true, "mysql-password": true}

func collectSecrets(args []string, env func(string) string) secrets {
	var s secrets
	add := func(name, v string) {
		if name == "dsn" {
			s = append(s, dsnSecrets(v)...)
		} else if v != "" {
			s = append(s, v)
		}
	}
	add("dsn", env("RMQTX_DSN"))
	add("mysql-password", env("RMQTX_MYSQL_PASSWORD"))
	// pgx reads libpq's variables itself: a DSN without a password may
	// take PGPASSWORD's.
	add("pgpassword", env("PGPASSWORD"))
	for i, a := range args {
		if !strings.HasPrefix(a, "-") {
			continue
		}
		name, v, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !secretFlags[name] {
			continue
		}
		if !hasValue && i+1 < len(args) {
			v = args[i+1]
		}
		add(name, v)
	}
	// Longest first, so a DSN is replaced whole before its password.
	sort.Slice(s, func(i, j int) bool { return len(s[i]) > len(s[j]) })
	return s
}

// dsnSecrets returns the password of a DSN, and for a DSN the driver cannot
// parse, the whole DSN and what would be its password: the text after the
// first ':' up to the last '@' (or, without '@', up to the last '/'). A
// PostgreSQL DSN (URL or keyword/value) gives the whole DSN and every
// password it holds, parsed or not (pgDSNSecrets).
func dsnSecrets(dsn string) []string {
	if dsn == "" {
		return nil
	}
	if isPostgresDSN(dsn) {
		return append([]string{dsn}, pgDSNSecrets(dsn)...)
	}
	if c, err := mysql.ParseDSN(dsn); err == nil {
		if c.Passwd == "" {
			return nil
		}
		return []string{dsn, c.Passwd}
	}
	out := []string{dsn}
	head := dsn
	if i := strings.LastIndex(head, "@"); i >= 0 {
		head = head[:i]
	} else if i := strings.LastIndex(head, "/"); i >= 0 {
		head = head[:i]
	}
	if _, pw, ok := strings.Cut(head, ":"); ok && pw != "" {
		out = append(out, pw)
	}
	return out
}

// scrub replaces every secret in text. It is applied to error texts only,
// never to data output; a password that is also an ordinary word is masked
// in errors wherever that word appears.
func (s secrets) scrub(text string) string {
	for _, v := range s {
		text = strings.ReplaceAll(text, v, "***")
	}
	return text
}
