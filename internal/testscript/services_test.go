package testscript

import (
	"database/sql"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
)

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// privateServices is scripts/services.sh pointed at a run folder and ports
// of one test's own, so that it never touches the shared services.
type privateServices struct {
	script string
	env    []string
}

func (p privateServices) run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", append([]string{p.script}, args...)...)
	// Run from the filesystem root, not the package folder: the script must
	// not depend on the caller's working folder.
	cmd.Dir = "/"
	cmd.Env = p.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (p privateServices) must(t *testing.T, args ...string) string {
	t.Helper()
	out, err := p.run(t, args...)
	require.NoError(t, err, "services.sh %s:\n%s", strings.Join(args, " "), out)
	return out
}

// exports parses `services.sh env`.
func (p privateServices) exports(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(p.must(t, "env"), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "export "), "=")
		if ok {
			m[k] = strings.Trim(v, "'")
		}
	}
	return m
}

// pgCannotEnter reports whether the postgres system user is refused entry
// to dir (checked as that user, as services.sh runs PostgreSQL).
func pgCannotEnter(t *testing.T, dir string) bool {
	t.Helper()
	err := exec.Command("setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", "test", "-x", dir).Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("setpriv as postgres: %v", err)
	}
	return err != nil
}

// Issue 31: `make demo` and `make test` must work from a clone in any
// folder, also as root in one whose parent is 0700 (a clone under /root,
// or in a `mktemp -d` folder). Run as root, services.sh starts PostgreSQL
// as the postgres user, which cannot enter such a folder; initdb failed
// with "Permission denied". Here the run folder lies inside a fresh 0700
// folder and the script runs from "/": MariaDB and PostgreSQL start on
// private ports, answer over TCP on 127.0.0.1, a second `up` finds them,
// `status`, `logs`, `down` and a restart find PostgreSQL's folder too, and
// `down` stops them. As root the test first proves that the postgres user
// really cannot enter the run folder, and that the cluster lives where it
// can; run as another user (CI runs as root) the servers run as that user,
// who owns the folder, and the cluster stays inside it: the same steps
// then prove the ordinary case.
func TestServicesFromPrivateFolder(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MariaDB and PostgreSQL; skipped in -short mode")
	}
	asRoot := os.Geteuid() == 0
	base, err := os.MkdirTemp("", "rmqtx-0700-")
	require.NoError(t, err)
	st, err := os.Stat(base)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm(), "MkdirTemp makes a 0700 folder, as mktemp -d")
	runDir := filepath.Join(base, "clone", ".run")
	if asRoot {
		require.True(t, pgCannotEnter(t, base), "the postgres user must be refused entry to %s, or this test proves nothing", base)
	}

	p := privateServices{script: filepath.Join(root(t), "scripts", "services.sh"), env: append(os.Environ(),
		"RMQTX_RUN_DIR="+runDir,
		"RMQTX_BROKERS=1",
		"RMQTX_MYSQL_PORT="+strconv.Itoa(freePort(t)),
		"RMQTX_PG_PORT="+strconv.Itoa(freePort(t)),
		"RMQTX_NAMESRV_PORT="+strconv.Itoa(freePort(t)),
		"RMQTX_BROKER_PORT="+strconv.Itoa(freePort(t)),
		"RMQTX_WAIT_SECONDS=120",
	)}
	// Stopped and removed at the end, PostgreSQL's folder outside the run
	// folder included; a detached reaper does it if this process dies first.
	record := filepath.Join(runDir, "postgres.dir")
	reap := `bash "$SCRIPT" down >/dev/null 2>&1; d=$(cat "$RMQTX_RUN_DIR/postgres.dir" 2>/dev/null); [ -n "$d" ] && rm -rf "$d"; rm -rf "$BASE"`
	reaper := exec.Command("setsid", "bash", "-c", `while kill -0 "$WATCH" 2>/dev/null; do sleep 2; done; `+reap)
	reaper.Env = append(p.env, "WATCH="+strconv.Itoa(os.Getpid()), "SCRIPT="+p.script, "BASE="+base)
	require.NoError(t, reaper.Start())
	require.NoError(t, reaper.Process.Release())
	t.Cleanup(func() {
		c := exec.Command("bash", "-c", reap)
		c.Env = append(p.env, "SCRIPT="+p.script, "BASE="+base)
		if out, err := c.CombinedOutput(); err != nil {
			t.Logf("clean-up: %v\n%s", err, out)
		}
	})

	start := time.Now()
	out := p.must(t, "up", "mariadb", "postgres")
	t.Logf("MariaDB and PostgreSQL up in %s from a 0700 folder:\n%s", time.Since(start).Round(100*time.Millisecond), out)
	require.Contains(t, out, "PostgreSQL 127.0.0.1:")
	require.NotContains(t, out, "namesrv", "only the services named start")

	pgDir := filepath.Join(runDir, "postgres")
	if asRoot {
		b, err := os.ReadFile(record)
		require.NoError(t, err, "the cluster's folder is recorded in the run folder")
		pgDir = strings.TrimSpace(string(b))
		require.False(t, strings.HasPrefix(pgDir, base+"/"), "the cluster lives outside the 0700 folder: %s", pgDir)
		require.False(t, pgCannotEnter(t, filepath.Join(pgDir, "data")), "the postgres user enters its data folder %s", pgDir)
	} else {
		require.NoFileExists(t, record, "a run folder its own user can enter keeps the cluster inside")
	}
	require.FileExists(t, filepath.Join(pgDir, "data", "PG_VERSION"))

	exp := p.exports(t)
	query := func(driver, dsn string) {
		t.Helper()
		db, err := sql.Open(driver, dsn)
		require.NoError(t, err)
		defer db.Close()
		var n int
		require.NoError(t, db.QueryRow("SELECT 40 + 2").Scan(&n), driver)
		require.Equal(t, 42, n, driver)
	}
	pgDSN := exp["RMQTX_PG_DSN"]
	require.Contains(t, pgDSN, "@127.0.0.1:")
	mysqlDSN := exp["RMQTX_MYSQL_USER"] + ":" + exp["RMQTX_MYSQL_PASSWORD"] + "@tcp(" + exp["RMQTX_MYSQL_ADDR"] + ")/" + exp["RMQTX_MYSQL_DATABASE"]
	require.True(t, strings.HasPrefix(exp["RMQTX_MYSQL_ADDR"], "127.0.0.1:"))
	query("pgx", pgDSN)
	query("mysql", mysqlDSN)

	// Idempotent, and every command finds the cluster: status, logs, a
	// second up, down, and an up that restarts it on the same data.
	pid, err := os.ReadFile(filepath.Join(runDir, "pids", "postgres.pid"))
	require.NoError(t, err)
	p.must(t, "up", "postgres")
	again, err := os.ReadFile(filepath.Join(runDir, "pids", "postgres.pid"))
	require.NoError(t, err)
	require.Equal(t, string(pid), string(again), "a second up leaves the running server alone")
	status, _ := p.run(t, "status") // exits 3: the name server and broker are stopped
	require.Regexp(t, `(?m)^postgres running`, status)
	require.Regexp(t, `(?m)^mariadb +running`, status)
	require.Contains(t, p.must(t, "logs", "postgres"), filepath.Join(pgDir, "postgres.log"))
	p.must(t, "down", "postgres")
	status, _ = p.run(t, "status")
	require.Regexp(t, `(?m)^postgres stopped`, status)
	p.must(t, "up", "postgres")
	query("pgx", pgDSN)
	p.must(t, "down")
	status, _ = p.run(t, "status")
	require.Regexp(t, `(?m)^postgres stopped`, status)
	require.Regexp(t, `(?m)^mariadb +stopped`, status)
}

// A name that is not a service fails up and down instead of starting or
// stopping nothing and succeeding.
func TestServicesRefuseUnknownNames(t *testing.T) {
	p := privateServices{script: filepath.Join(root(t), "scripts", "services.sh"),
		env: append(os.Environ(), "RMQTX_RUN_DIR="+t.TempDir(), "RMQTX_BROKERS=1")}
	for _, args := range [][]string{{"up", "postgre"}, {"down", "mariadb", "brokers"}, {"up", "broker-b"}, {"kill9"}} {
		out, err := p.run(t, args...)
		require.Error(t, err, "services.sh %v must fail:\n%s", args, out)
		require.NotContains(t, out, "starting", "services.sh %v started something", args)
	}
}

// `make demo` starts only what its database needs: the database it runs on,
// the name server and the broker (issue 31). Run with stub services and a
// fake go, it names exactly those to `up` and runs the example on that
// engine.
func TestDemoStartsOnlyItsDatabase(t *testing.T) {
	for db, want := range map[string]struct{ up, engine string }{
		"":         {"up mariadb namesrv broker", "-engine mysql"},
		"mariadb":  {"up mariadb namesrv broker", "-engine mysql"},
		"postgres": {"up postgres namesrv broker", "-engine postgres"},
		"pg":       {"up postgres namesrv broker", "-engine postgres"},
	} {
		t.Run("DB="+db, func(t *testing.T) {
			dir := t.TempDir()
			calls := filepath.Join(dir, "calls")
			stub := func(name string) string {
				p := filepath.Join(dir, name)
				require.NoError(t, os.WriteFile(p, []byte("#!/usr/bin/env bash\necho \""+name+" $*\" >>'"+calls+"'\n"), 0o755))
				return p
			}
			cmd := exec.Command("bash", filepath.Join(root(t), "scripts", "demo.sh"), "-payments", "3")
			cmd.Dir = "/"
			cmd.Env = append(os.Environ(), "DB="+db, "RMQTX_SERVICES="+stub("services"), "RMQTX_GO="+stub("go"))
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			b, err := os.ReadFile(calls)
			require.NoError(t, err)
			require.Equal(t, []string{
				"services " + want.up,
				"services env",
				"go run ./examples/payment " + want.engine + " -payments 3",
			}, strings.Split(strings.TrimSpace(string(b)), "\n"))
		})
	}
	out, err := exec.Command("bash", "-c", `DB=oracle bash "$0"`, filepath.Join(root(t), "scripts", "demo.sh")).CombinedOutput()
	require.Error(t, err, "an unknown DB is refused: %s", out)
	require.Contains(t, string(out), "DB is mariadb (default) or postgres")
}
