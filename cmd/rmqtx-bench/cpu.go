package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuMeter reads the CPU time (user + system) of the bench process and of
// the database server and the broker when they run on this machine (found
// in /proc by the port they listen on), so a drain can say where its CPU
// went per message. When the cores are saturated, throughput is the cores
// divided by the sum. Other clients of the same servers count too: only a
// quiet machine gives clean figures.
type cpuMeter struct {
	dbPID, brokerPID int // 0: not found (remote, no /proc, or not permitted)
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTick = 100

func newCPUMeter(mysqlAddr, brokerAddr string) cpuMeter {
	return cpuMeter{dbPID: listeningPID(mysqlAddr), brokerPID: listeningPID(brokerAddr)}
}

// listeningPID returns the process listening on addr's TCP port, or 0.
func listeningPID(addr string) int {
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

// cpuSample is the CPU time used so far by the bench and by the servers.
type cpuSample struct {
	self, db, broker time.Duration
	dbOK, brokerOK   bool
}

func (m cpuMeter) sample() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if m.dbPID > 0 {
		s.db, s.dbOK = procCPU(m.dbPID)
	}
	if m.brokerPID > 0 {
		s.broker, s.brokerOK = procCPU(m.brokerPID)
	}
	return s
}

// procCPU reads utime + stime of pid from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'. utime and stime are fields 14 and 15.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * time.Second / clockTick, true
}

// perMessage adds to extra the CPU microseconds per message between a and b.
func (a cpuSample) perMessage(b cpuSample, msgs int64, extra map[string]float64) {
	if msgs <= 0 {
		return
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(msgs) }
	extra["bench_cpu_us_per_msg"] = per(b.self - a.self)
	if a.dbOK && b.dbOK {
		extra["db_cpu_us_per_msg"] = per(b.db - a.db)
	}
	if a.brokerOK && b.brokerOK {
		extra["broker_cpu_us_per_msg"] = per(b.broker - a.broker)
	}
}
