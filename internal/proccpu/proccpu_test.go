package proccpu

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ListeningPID is tested through the bench's meter (cmd/rmqtx-bench
// TestCPUMeterFindsListener).

// TreeCPU counts a live child's CPU, and a reaped child's through the
// parent's cutime, so a process that forks per connection (PostgreSQL) is
// measured whole.
func TestTreeCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Fatalf("needs Linux /proc: %v", err)
	}
	ppid, ticks, ok := ParseStat([]byte("4242 (a (b) c) S 17 1 1 0 -1 4194560 100 0 0 0 250 30 7 3 20 0 1 0 5 0 0"))
	require.True(t, ok)
	require.Equal(t, 17, ppid)
	require.Equal(t, int64(250+30+7+3), ticks)
	_, _, ok = ParseStat([]byte("garbage"))
	require.False(t, ok)

	self := os.Getpid()
	own := func() int64 {
		b, err := os.ReadFile("/proc/self/stat")
		require.NoError(t, err)
		_, n, ok := ParseStat(b)
		require.True(t, ok)
		return n
	}
	_, ok = TreeCPU(1 << 30)
	require.False(t, ok, "no such process")

	// A live busy child: counted under this process.
	cmd := exec.Command("sh", "-c", "while :; do :; done")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	child := func() int64 {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/stat")
		require.NoError(t, err)
		_, n, ok := ParseStat(b)
		require.True(t, ok)
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for child() < 3 {
		require.True(t, time.Now().Before(deadline), "the child used no CPU in 30 s")
		runtime.Gosched()
	}
	o0, c0 := own(), child()
	tree, ok := TreeCPU(self)
	require.True(t, ok)
	require.GreaterOrEqual(t, tree, time.Duration(o0+c0)*time.Second/ClockTick)

	// The part: the child, picked by its command line, and nothing else.
	total, picked, ok := TreeCPUPart(self, func(c string) bool { return c == "sh -c while :; do :; done" })
	require.True(t, ok)
	require.GreaterOrEqual(t, picked, time.Duration(c0)*time.Second/ClockTick, "the child's CPU is the part")
	require.Less(t, picked, total-time.Duration(o0)*time.Second/ClockTick+time.Second, "the part holds the child only")
	_, none, ok := TreeCPUPart(self, func(string) bool { return false })
	require.True(t, ok)
	require.Zero(t, none)

	// Reaped: its time moves into this process's cutime, the sum stays.
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	c1 := time.Duration(cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime())
	after, ok := TreeCPU(self)
	require.True(t, ok)
	require.GreaterOrEqual(t, after, tree)
	require.GreaterOrEqual(t, time.Duration(own()-o0)*time.Second/ClockTick, c1-2*time.Second/ClockTick,
		"the reaped child's %s is in this process's cutime", c1)
}

// A PostgreSQL process serves a client connection when its title names a
// user, a database and the client's address; background processes and
// workers have other titles.
func TestPostgresSession(t *testing.T) {
	for title, want := range map[string]bool{
		"postgres: rmqtx rmqtx_bench_bd26f2 127.0.0.1(53768) idle in transaction": true,
		"postgres: rmqtx rmqtx 127.0.0.1(53766) idle":                             true,
		"postgres: postgres postgres [local] SELECT":                              true,
		"postgres: main: rmqtx rmqtx 127.0.0.1(5) INSERT":                         true,
		"postgres: rmqtx rmqtx ::1(60000) COMMIT":                                 true,
		"postgres: checkpointer":                                                  false,
		"postgres: background writer":                                             false,
		"postgres: walwriter":                                                     false,
		"postgres: autovacuum launcher":                                           false,
		"postgres: autovacuum worker rmqtx_bench_c3f5ce":                          false,
		"postgres: parallel worker for PID 7750":                                  false,
		"postgres: logical replication launcher":                                  false,
		"postgres: walsender repl 127.0.0.1(5) streaming 0/3000060":               false,
		"/usr/lib/postgresql/15/bin/postgres -D /data":                            false,
		"": false,
	} {
		require.Equal(t, want, PostgresSession(title), title)
	}
}
