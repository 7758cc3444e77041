// Package proccpu reads processes' CPU times from Linux /proc, for the
// tools that split a run's CPU between the bench, the database server and
// the broker (cmd/rmqtx-bench, internal/tools/pgcpu): one reader, so both
// count a process tree the same way. Elsewhere than Linux, or without
// permission, every lookup reports not found.
package proccpu

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
		return 0, false
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
		todo = append(todo, children[pid]...)
	}
	return time.Duration(ticks) * time.Second / ClockTick, true
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
