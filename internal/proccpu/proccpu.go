// Package proccpu reads processes' CPU times from Linux /proc, for the
// tools that split a run's CPU between the bench, the database server and
// the broker (cmd/rmqtx-bench, internal/tools/pgcpu): one reader, so both
// count a process tree the same way. It also splits a server's CPU where a
// per-side figure would otherwise carry work no side asked for at that
// moment: PostgreSQL's sessions apart from its background processes
// (autovacuum runs whenever its naptime comes round, on whichever side is
// measured then), and a JVM's threads by name (the broker's network threads
// apart from its store). Elsewhere than Linux, or without permission,
// every lookup reports not found.
package proccpu

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ClockTick is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const ClockTick = 100

// ListeningPID returns the process listening on addr's TCP port, or 0.
func ListeningPID(addr string) int {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return 0
	}
	var inodes []string
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		inodes = append(inodes, listenInodes(f, port)...)
	}
	if len(inodes) == 0 {
		return 0
	}
	want := map[string]bool{}
	for _, in := range inodes {
		want["socket:["+in+"]"] = true
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && want[l] {
			pid, _ := strconv.Atoi(strings.Split(fd, "/")[2])
			return pid
		}
	}
	return 0
}

// listenInodes returns the socket inodes of file (/proc/net/tcp format)
// listening on port.
func listenInodes(file string, port int) []string {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	local := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		// sl local_address rem_address st ... inode (field 9)
		if len(fl) > 9 && strings.HasSuffix(fl[1], local) && fl[3] == "0A" { // 0A: LISTEN
			out = append(out, fl[9])
		}
	}
	return out
}

// TreeCPU is the CPU time (user + system) of root and of every process
// below it, with each one's reaped children: PostgreSQL serves every
// connection from a process of its own, which the postmaster's own
// figures do not count while it lives. A child that exits and is reaped
// moves its time into its parent's cutime/cstime, so the sum stays
// continuous. MariaDB and the broker are one process each. It reports
// false when root does not exist.
func TreeCPU(root int) (time.Duration, bool) {
	total, _, ok := TreeCPUPart(root, nil)
	return total, ok
}

// TreeCPUPart is TreeCPU with the part of it spent by the processes below
// root whose command line (its arguments joined by spaces, which a process
// may rewrite as its title, as PostgreSQL does) part accepts: their own
// times and their reaped children's. A nil part picks none. A picked
// process that exits moves its time into its parent's, which part need not
// pick: over a window, the part is exact for processes that outlive it
// (the pooled connections a bench keeps).
func TreeCPUPart(root int, part func(cmdline string) bool) (total, picked time.Duration, ok bool) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	type proc struct {
		ppid  int
		ticks int64
	}
	procs := map[int]proc{}
	for _, f := range stats {
		pid, err := strconv.Atoi(strings.Split(f, "/")[2])
		if err != nil {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			continue // exited meanwhile
		}
		ppid, ticks, ok := ParseStat(b)
		if ok {
			procs[pid] = proc{ppid, ticks}
		}
	}
	if _, ok := procs[root]; !ok {
		return 0, 0, false
	}
	children := map[int][]int{}
	for pid, p := range procs {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	var ticks int64
	todo := []int{root}
	for len(todo) > 0 {
		pid := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		ticks += procs[pid].ticks
		if part != nil && pid != root && part(cmdline(pid)) {
			picked += ticksDuration(procs[pid].ticks)
		}
		todo = append(todo, children[pid]...)
	}
	return ticksDuration(ticks), picked, true
}

func ticksDuration(t int64) time.Duration { return time.Duration(t) * time.Second / ClockTick }

// cmdline is pid's command line with its arguments joined by spaces ("" when
// it is gone or unreadable).
func cmdline(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// postgresSession matches the title of a PostgreSQL process that serves a
// client connection: "postgres: USER DATABASE HOST(PORT) STATE", or with
// [local] for a socket, after an optional "CLUSTER: " (cluster_name).
// Background processes (checkpointer, background writer, walwriter,
// autovacuum launcher and workers, parallel workers, walsenders) have other
// titles.
var postgresSession = regexp.MustCompile(`^postgres: (?:\S+: )?\S+ \S+ (?:\[local\]|\S+\(\d+\))(?: |$)`)

// PostgresSession reports whether title is that of a PostgreSQL process
// serving a client connection (a session, or backend), not a background
// process or worker.
func PostgresSession(title string) bool {
	return postgresSession.MatchString(title) && !strings.HasPrefix(title, "postgres: walsender ")
}

// Threads is the CPU time (user + system) of a process's live threads,
// and the part of it spent by the threads a name prefix picked.
type Threads struct {
	Total, Picked time.Duration
	Matched       int // threads picked
}

// ThreadsCPU reads pid's live threads, picking those whose name (comm, at
// most 15 bytes: the JVM's thread names cut short) starts with one of
// prefixes. A thread that has ended counts in the process's times, not
// here.
func ThreadsCPU(pid int, prefixes ...string) (Threads, bool) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tids, err := os.ReadDir(dir)
	if err != nil {
		return Threads{}, false
	}
	var all, part int64
	var th Threads
	for _, t := range tids {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/stat")
		if err != nil {
			continue // ended meanwhile
		}
		name, ticks, ok := threadStat(b)
		if !ok {
			continue
		}
		all += ticks
		for _, p := range prefixes {
			if strings.HasPrefix(name, p) {
				part += ticks
				th.Matched++
				break
			}
		}
	}
	th.Total, th.Picked = ticksDuration(all), ticksDuration(part)
	return th, true
}

// Comm is pid's command name (/proc/<pid>/comm; "" when it is gone or
// unreadable): "postgres" for PostgreSQL's postmaster.
func Comm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// threadStat reads a thread's name and utime+stime (clock ticks) from a
// /proc/<pid>/task/<tid>/stat line.
func threadStat(b []byte) (name string, ticks int64, ok bool) {
	i, j := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
	if i < 0 || j < i {
		return "", 0, false
	}
	f := strings.Fields(string(b[j+1:]))
	if len(f) < 13 {
		return "", 0, false
	}
	for _, x := range f[11:13] {
		v, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return "", 0, false
		}
		ticks += v
	}
	return string(b[i+1 : j]), ticks, true
}

// ParseStat reads the parent pid and utime+stime+cutime+cstime (clock
// ticks) from a /proc/<pid>/stat line.
func ParseStat(b []byte) (ppid int, ticks int64, ok bool) {
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'. ppid is field 4, utime..cstime fields 14-17.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0, 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, false
	}
	for _, x := range f[11:15] {
		v, err := strconv.ParseInt(x, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		ticks += v
	}
	return ppid, ticks, true
}
