package main

import (
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
