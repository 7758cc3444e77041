package main

import (
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// Distinctive secrets: a hit in any output is a leak, not a coincidence.
const (
	dsnSecret = "Dsn-S3cret-7781"
	envSecret = "Env-S3cret-4410"
	argSecret = "Arg-S3cret-9902"
)

func requireNoSecret(t *testing.T, r result, what string) {
	t.Helper()
	for _, s := range []string{dsnSecret, envSecret, argSecret} {
		require.NotContains(t, r.stdout+r.stderr, s, "%s printed a password\nstdout:\n%s\nstderr:\n%s", what, r.stdout, r.stderr)
	}
}

// subcommands is every command as typed ("dead list" is two words).
func subcommands() [][]string {
	var out [][]string
	for name := range commands {
		out = append(out, strings.Fields(name))
	}
	sort.Slice(out, func(i, j int) bool { return strings.Join(out[i], " ") < strings.Join(out[j], " ") })
	return out
}

// No output path prints a password: help and every usage error of every
// subcommand, with the passwords in the environment or on the command line,
// config (table and JSON), a DSN the driver cannot parse, a flag before the
// command.
func TestNoSecretInHelpUsageOrConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"RMQTX_DSN":            "app:" + dsnSecret + "@tcp(127.0.0.1:1)/rmqtx_db",
		"RMQTX_MYSQL_PASSWORD": envSecret,
		"RMQTX_NAMESRV":        "127.0.0.1:9876",
	}
	argDSN := "app:" + argSecret + "@tcp(127.0.0.1:1)/rmqtx_db"
	bad := [][]string{{"--bogus"}, {"--timeout", "soon"}, {"--json=maybe"}, {"--redact-prefix", "x"}, {"--dsn"},
		{"--dsn", argDSN, "--bogus"}, {"--mysql-password=" + argSecret, "--timeout=soon"}, {"--redact-prefix", "-1"}}
	for _, sub := range subcommands() {
		for _, h := range []string{"-h", "--help"} {
			r := runCLI(env, append(append([]string{}, sub...), h)...)
			requireNoSecret(t, r, strings.Join(sub, " ")+" "+h)
			require.Equal(t, exitOK, r.code, "%v %s: %s", sub, h, r.stderr)
			require.Contains(t, r.stderr, "-dsn string", "%v %s prints the flags", sub, h)
			require.Contains(t, r.stderr, "[RMQTX_DSN is set]", "help says the variable is set, not its value")
			require.NotContains(t, r.stderr, "help requested")
		}
		for _, b := range bad {
			args := append(append([]string{}, sub...), b...)
			r := runCLI(env, args...)
			requireNoSecret(t, r, strings.Join(args, " "))
			require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
			require.Contains(t, r.stderr, "rmqtx "+strings.Join(sub, " ")+": usage: ", "%v says what was wrong", args)
		}
	}
	// A flag before the command, the DSN on it.
	r := runCLI(env, "--dsn="+argDSN, "stats")
	requireNoSecret(t, r, "--dsn=... stats")
	require.Equal(t, exitUsage, r.code)
	r = runCLI(env, "dead", "--dsn="+argDSN)
	requireNoSecret(t, r, "dead --dsn=...")
	require.Equal(t, exitUsage, r.code)

	for _, args := range [][]string{{"config"}, {"config", "--json"}, {"config", "--dsn", argDSN}, {"config", "--json", "--dsn=" + argDSN}} {
		r := runCLI(env, args...)
		requireNoSecret(t, r, strings.Join(args, " "))
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "app:***@tcp(127.0.0.1:1)/rmqtx_db", "the DSN is shown masked")
	}
	r = runCLI(map[string]string{"RMQTX_MYSQL_PASSWORD": envSecret, "RMQTX_MYSQL_DATABASE": "d"}, "config", "--json")
	requireNoSecret(t, r, "config --json (password from RMQTX_MYSQL_PASSWORD)")
	require.Contains(t, r.stdout, `"dsn": "root:***@tcp(127.0.0.1:3306)/d`)

	// DSNs the driver cannot parse. Without "@" the driver quotes
	// "user:password" as the network name in its error.
	for _, dsn := range []string{"app:" + dsnSecret + "/rmqtx_db", "app:" + dsnSecret + "@bogus(", "app:" + dsnSecret + "@tcp(h:1)/d?timeout=x" + dsnSecret} {
		for _, args := range [][]string{{"config"}, {"config", "--json"}, {"stats", "--json"}} {
			r := runCLI(map[string]string{"RMQTX_DSN": dsn}, args...)
			requireNoSecret(t, r, dsn+" "+strings.Join(args, " "))
			require.Equal(t, exitUsage, r.code, "%s %v: %s", dsn, args, r.stderr)
			require.Contains(t, r.stderr, "cannot parse the DSN")
		}
	}
}

// Connection failures do not print the password either: an unreachable
// address, and the real MariaDB refusing a wrong password; and --json output
// over the real database with a password in the environment.
func TestNoSecretWhenConnecting(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	db := testenv.DB(t)
	name := testenv.DBName(t, db)
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"RMQTX_DSN": "app:" + dsnSecret + "@tcp(127.0.0.1:1)/" + name}, "connect to database " + name + " at 127.0.0.1:1 as app"},
		{map[string]string{"RMQTX_DSN": s.MySQLUser + ":" + dsnSecret + "@tcp(" + s.MySQLAddr + ")/" + name}, "Access denied"},
		{map[string]string{"RMQTX_MYSQL_ADDR": s.MySQLAddr, "RMQTX_MYSQL_USER": s.MySQLUser, "RMQTX_MYSQL_PASSWORD": envSecret,
			"RMQTX_MYSQL_DATABASE": name}, "Access denied"},
	} {
		for _, args := range [][]string{{"stats"}, {"stats", "--json"}, {"inspect", "--json", "x"}, {"migrate", "--json"},
			{"dead", "list", "--json"}, {"mysql-password"}} {
			flagPw := args[0] == "mysql-password"
			if flagPw {
				args = []string{"stats", "--mysql-password", argSecret, "--mysql-addr", s.MySQLAddr, "--mysql-user", s.MySQLUser,
					"--mysql-database", name}
			}
			r := runCLI(tc.env, append(args, "--timeout", "5s")...)
			requireNoSecret(t, r, strings.Join(args, " "))
			require.Equal(t, exitRuntime, r.code, "%v: %s", args, r.stderr)
			if !flagPw {
				require.Contains(t, r.stderr, tc.want, "%v", args)
			}
		}
	}
	// Working connections, a password in the environment that is not used
	// (the DSN wins) and one on a flag that is not used: --json output.
	env := map[string]string{"RMQTX_DSN": s.DSN(name), "RMQTX_MYSQL_PASSWORD": envSecret}
	for _, args := range [][]string{{"migrate", "--json"}, {"stats", "--json"}, {"config", "--json"}, {"stuck", "--json"},
		{"dead", "list", "--json", "--mysql-password", argSecret}, {"inspect", "--json", "--no-broker", "x"}} {
		r := runCLI(env, args...)
		requireNoSecret(t, r, strings.Join(args, " "))
		require.Contains(t, []int{exitOK, exitFindings}, r.code, "%v: %s", args, r.stderr)
		require.True(t, strings.HasPrefix(strings.TrimSpace(r.stdout), "{") || strings.HasPrefix(strings.TrimSpace(r.stdout), "["), "%v prints JSON: %s", args, r.stdout)
	}
}

// pgDSNs are PostgreSQL DSNs holding dsnSecret, in the forms an operator
// writes, each with the masked form config must print.
var pgDSNs = []struct{ dsn, masked string }{
	{"postgres://app:" + dsnSecret + "@127.0.0.1:1/rmqtx_db?sslmode=disable", "postgres://app:***@127.0.0.1:1/rmqtx_db?sslmode=disable"},
	// Percent-encoded '@' in the password, and a second password setting.
	{"postgresql://app:" + dsnSecret + "%40x@127.0.0.1:1/rmqtx_db?sslpassword=" + dsnSecret + "&sslmode=disable",
		"postgresql://app:***@127.0.0.1:1/rmqtx_db?sslpassword=***&sslmode=disable"},
	{"host=127.0.0.1 port=1 user=app password='" + dsnSecret + ` it\'s` + "' dbname=rmqtx_db sslmode=disable",
		"host=127.0.0.1 port=1 user=app password=*** dbname=rmqtx_db sslmode=disable"},
	{"postgres://app@127.0.0.1:1/rmqtx_db?password=" + dsnSecret, "postgres://app@127.0.0.1:1/rmqtx_db?password=***"},
}

// A PostgreSQL DSN is selected by its form and its password is never
// printed: not by help or usage errors of any subcommand, not by config
// (masked, table and JSON), not for a DSN pgx cannot parse.
func TestNoSecretPostgresDSN(t *testing.T) {
	t.Parallel()
	bad := [][]string{{"--bogus"}, {"--timeout", "soon"}, {"--redact-prefix", "-1"}}
	for _, d := range pgDSNs {
		env := map[string]string{"RMQTX_DSN": d.dsn, "RMQTX_NAMESRV": "127.0.0.1:9876"}
		for _, sub := range subcommands() {
			r := runCLI(env, append(append([]string{}, sub...), "-h")...)
			requireNoSecret(t, r, strings.Join(sub, " ")+" -h")
			require.Equal(t, exitOK, r.code, "%v -h: %s", sub, r.stderr)
			require.Contains(t, r.stderr, "[RMQTX_DSN is set]")
			for _, b := range bad {
				for _, args := range [][]string{append(append([]string{}, sub...), b...), append(append(append([]string{}, sub...), "--dsn", d.dsn), b...)} {
					r := runCLI(env, args...)
					requireNoSecret(t, r, strings.Join(args, " "))
					require.Equal(t, exitUsage, r.code, "%v: %s", args, r.stderr)
				}
			}
		}
		for _, args := range [][]string{{"config"}, {"config", "--json"}, {"config", "--dsn", d.dsn}, {"config", "--json", "--dsn=" + d.dsn}} {
			r := runCLI(map[string]string{"RMQTX_DSN": d.dsn}, args...)
			requireNoSecret(t, r, d.dsn+" "+strings.Join(args, " "))
			require.Equal(t, exitOK, r.code, r.stderr)
			out := r.stdout
			if strings.Contains(strings.Join(args, " "), "--json") {
				var v struct{ Driver, DSN string }
				require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
				out = v.Driver + "\n" + v.DSN
			}
			require.Contains(t, out, d.masked, "the DSN is shown masked")
			require.Contains(t, out, "pgx", "the DSN selects PostgreSQL")
		}
	}
	// DSNs pgx cannot parse, and one without a database.
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://app:" + dsnSecret + "@127.0.0.1:x/d", "cannot parse the DSN"},
		{"postgres://app:" + dsnSecret + "@[::1/d", "cannot parse the DSN"},
		{"postgres://app:" + dsnSecret + "@h/d?connect_timeout=x" + dsnSecret, "cannot parse the DSN"},
		{"postgres://app:" + dsnSecret + "/x@h/d?sslmode=" + dsnSecret, "cannot parse the DSN"},
		{"host=127.0.0.1 password='" + dsnSecret, "cannot parse the DSN"},
		{"host=127.0.0.1 port=" + dsnSecret + " password=" + dsnSecret + " dbname=d", "cannot parse the DSN"},
		{"postgres://app:" + dsnSecret + "@127.0.0.1:1", "no database"},
	} {
		for _, args := range [][]string{{"config"}, {"config", "--json"}, {"stats", "--json"}, {"stats", "--dsn", tc.dsn}} {
			env := map[string]string{"RMQTX_DSN": tc.dsn}
			if args[len(args)-1] == tc.dsn {
				env = nil
			}
			r := runCLI(env, args...)
			requireNoSecret(t, r, tc.dsn+" "+strings.Join(args, " "))
			require.Equal(t, exitUsage, r.code, "%s %v: %s", tc.dsn, args, r.stderr)
			require.Contains(t, r.stderr, tc.want, "%s %v", tc.dsn, args)
		}
	}
}

// Connecting to PostgreSQL prints no password either: an unreachable
// address, the real server refusing a wrong password (URL and
// keyword/value), and --json output over the real database.
func TestNoSecretWhenConnectingPostgres(t *testing.T) {
	t.Parallel()
	db := testenv.PostgresDB(t)
	good, err := url.Parse(cliDSN(t, db))
	require.NoError(t, err)
	name := testenv.DBName(t, db)
	user := good.User.Username()
	wrong := *good
	wrong.User = url.UserPassword(user, dsnSecret)
	kv := fmt.Sprintf("host=%s port=%s user=%s password='%s' dbname=%s sslmode=disable", good.Hostname(), good.Port(), user, dsnSecret, name)
	for _, tc := range []struct {
		dsn, want string
	}{
		{"postgres://app:" + dsnSecret + "@127.0.0.1:1/" + name, "connect to database " + name + " at 127.0.0.1:1 as app"},
		{wrong.String(), "password authentication failed"},
		{kv, "password authentication failed"},
	} {
		for _, args := range [][]string{{"stats"}, {"stats", "--json"}, {"inspect", "--json", "x"}, {"migrate", "--json"}, {"dead", "list", "--json"}, {"stuck"}} {
			r := runCLI(map[string]string{"RMQTX_DSN": tc.dsn}, append(args, "--timeout", "5s")...)
			requireNoSecret(t, r, strings.Join(args, " "))
			require.Equal(t, exitRuntime, r.code, "%v: %s", args, r.stderr)
			require.Contains(t, r.stderr, tc.want, "%v", args)
		}
	}
	env := map[string]string{"RMQTX_DSN": good.String(), "RMQTX_MYSQL_PASSWORD": envSecret}
	for _, args := range [][]string{{"migrate", "--json"}, {"stats", "--json"}, {"config", "--json"}, {"stuck", "--json"},
		{"dead", "list", "--json", "--mysql-password", argSecret}, {"inspect", "--json", "--no-broker", "x"}} {
		r := runCLI(env, args...)
		requireNoSecret(t, r, strings.Join(args, " "))
		require.Contains(t, []int{exitOK, exitFindings}, r.code, "%v: %s", args, r.stderr)
		require.True(t, strings.HasPrefix(strings.TrimSpace(r.stdout), "{") || strings.HasPrefix(strings.TrimSpace(r.stdout), "["), "%v prints JSON: %s", args, r.stdout)
	}
}
