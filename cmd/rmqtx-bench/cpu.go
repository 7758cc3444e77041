package main

import (
	"syscall"
	"time"

	"github.com/rmqtx/rmqtx/internal/proccpu"
)

// cpuMeter reads the CPU time (user + system) of the bench process and of
// the database server and the broker when they run on this machine (found
// in /proc by the port they listen on, each with its process tree: see
// proccpu.TreeCPU), so a round can say where its CPU went per operation. It is the
// bench's one reader of /proc CPU times (the drains, the CPU split, the
// scale curve). When the cores are saturated, throughput is the cores
// divided by the sum. Other clients of the same servers count too: only a
// quiet machine gives clean figures.
type cpuMeter struct {
	dbPID, brokerPID int  // 0: not found (remote, no /proc, or not permitted)
	dbPostgres       bool // the database is PostgreSQL: its sessions' share is read apart
}

func newCPUMeter(dbAddr, brokerAddr string) cpuMeter {
	m := cpuMeter{dbPID: proccpu.ListeningPID(dbAddr), brokerPID: proccpu.ListeningPID(brokerAddr)}
	m.dbPostgres = m.dbPID > 0 && proccpu.Comm(m.dbPID) == "postgres"
	return m
}

// brokerNetThreads are the name prefixes (cut at 15 bytes, as /proc keeps
// them) of the broker's Netty server threads: accepting, reading and
// writing its sockets and coding its frames. Their CPU per operation
// follows how many requests each wake-up finds, so the pacing of the sides'
// requests moves it, not only what they send.
var brokerNetThreads = []string{"NettyServerNIO", "NettyServerEPOL", "NettyServerCode", "NettyNIOBoss", "NettyEPOLLBoss"}

// cpuSample is the CPU time used so far by the bench and by the servers.
type cpuSample struct {
	self, db, broker time.Duration
	dbOK, brokerOK   bool
	// dbSessions is the part of db spent by PostgreSQL's processes that
	// serve connections (not autovacuum, the WAL writer, the checkpointer
	// or exited workers); brokerNet the part of broker spent by its network
	// threads (brokerNetThreads). Each is set only where it was measured.
	dbSessions, brokerNet     time.Duration
	dbSessionsOK, brokerNetOK bool
}

func (m cpuMeter) sample() cpuSample {
	var s cpuSample
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if m.dbPID > 0 {
		if m.dbPostgres {
			s.db, s.dbSessions, s.dbOK = proccpu.TreeCPUPart(m.dbPID, proccpu.PostgresSession)
			s.dbSessionsOK = s.dbOK
		} else {
			s.db, s.dbOK = proccpu.TreeCPU(m.dbPID)
		}
	}
	if m.brokerPID > 0 {
		s.broker, s.brokerOK = proccpu.TreeCPU(m.brokerPID)
		var th proccpu.Threads
		th, s.brokerNetOK = proccpu.ThreadsCPU(m.brokerPID, brokerNetThreads...)
		s.brokerNet = th.Picked
	}
	return s
}

// sub is the CPU used between b and a (a taken later).
func (a cpuSample) sub(b cpuSample) cpuSample {
	return cpuSample{self: a.self - b.self, db: a.db - b.db, broker: a.broker - b.broker, dbOK: a.dbOK && b.dbOK, brokerOK: a.brokerOK && b.brokerOK,
		dbSessions: a.dbSessions - b.dbSessions, brokerNet: a.brokerNet - b.brokerNet,
		dbSessionsOK: a.dbSessionsOK && b.dbSessionsOK, brokerNetOK: a.brokerNetOK && b.brokerNetOK}
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
