package main

import (
	"net"
	"os"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/proccpu"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// The meter finds a process by the port it listens on (here: this one) and
// reads its CPU time from /proc.
func TestCPUMeterFindsListener(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Fatalf("needs Linux /proc: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	m := newCPUMeter(l.Addr().String(), "127.0.0.1:1")
	require.Equal(t, os.Getpid(), m.dbPID)
	require.Zero(t, m.brokerPID, "nothing listens on port 1")
	s := m.sample()
	require.True(t, s.dbOK)
	require.False(t, s.brokerOK)
	extra := map[string]float64{}
	cpuSample{dbOK: true}.perMessage(s, 1, extra)
	require.Contains(t, extra, "db_cpu_us_per_msg")
	require.NotContains(t, extra, "broker_cpu_us_per_msg")
	require.GreaterOrEqual(t, extra["bench_cpu_us_per_msg"], 0.0)
}

// On the real servers the meter reads the parts apart: a query's work
// lands in PostgreSQL's sessions, within the database's figure, and the
// broker's network threads are found by name; MariaDB, one process, has no
// sessions part.
func TestCPUMeterSplitsTheServers(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		s := LoadServices()
		pg := db.DriverName() == "pgx"
		s.Engine = engineMySQL
		if pg {
			s.Engine = enginePostgres
		}
		m := newCPUMeter(s.DBAddr(), s.Broker)
		require.Positive(t, m.dbPID, "the database at %s", s.DBAddr())
		require.Positive(t, m.brokerPID, "the broker at %s", s.Broker)
		require.Equal(t, pg, m.dbPostgres)
		tick := time.Second / proccpu.ClockTick

		// The network threads are found by name (the boss thread exists from
		// the broker's start; the others from its first connection), and
		// their CPU is part of the broker's.
		th, ok := proccpu.ThreadsCPU(m.brokerPID, brokerNetThreads...)
		require.True(t, ok)
		require.Positive(t, th.Matched, "the broker has threads named %v", brokerNetThreads)
		a := m.sample()
		require.True(t, a.brokerNetOK)
		require.LessOrEqual(t, a.brokerNet, a.broker+5*tick, "the network threads are part of the broker")
		if !pg {
			require.False(t, a.dbSessionsOK, "MariaDB is one process: no sessions part")
			return
		}
		var n int64
		require.NoError(t, db.Get(&n, "SELECT count(*) FROM generate_series(1, 5000000)"))
		require.EqualValues(t, 5000000, n)
		d := m.sample().sub(a)
		require.True(t, d.dbOK)
		require.True(t, d.dbSessionsOK)
		require.GreaterOrEqual(t, d.dbSessions, 5*tick, "the query ran in a session")
		require.LessOrEqual(t, d.dbSessions, d.db, "the sessions are part of the database")
	})
}
