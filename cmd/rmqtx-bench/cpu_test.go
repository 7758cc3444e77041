package main

import (
	"net"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
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
