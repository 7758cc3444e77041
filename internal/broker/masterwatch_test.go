package broker_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker"
)

// A sentinel reports its broker as soon as the broker's side closes the
// connection (what a killed process's kernel does), a broker that is down
// refuses a new sentinel, and Close ends every sentinel still open.
func TestSentinelsReportAClosedBrokerAtOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	s := broker.NewSentinels(time.Second)
	defer s.Close()

	require.True(t, s.Watch(addr))
	require.True(t, s.Watch(addr), "one sentinel per address; a second Watch reports it running")
	// Count the connections the two Watch calls opened: a marker connection
	// opened after them is accepted after them (the listen queue is FIFO).
	marker, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer marker.Close()
	server := <-accepted
	second := <-accepted
	require.Equal(t, marker.LocalAddr().String(), second.RemoteAddr().String(), "the second Watch opened no second connection")
	require.NoError(t, second.Close())
	closedAt := time.Now()
	require.NoError(t, server.Close())
	select {
	case got := <-s.Lost():
		require.Equal(t, addr, got)
		t.Logf("reported %s after the close", time.Since(closedAt))
	case <-time.After(10 * time.Second):
		t.Fatal("the closed connection was not reported")
	}

	require.NoError(t, ln.Close())
	require.False(t, s.Watch(addr), "a broker that refuses connections gets no sentinel")
	require.False(t, broker.Accepts(context.Background(), addr, time.Second))

	// Close ends an open sentinel (and reports nothing after).
	ln2, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln2.Close()
	go func() {
		if c, err := ln2.Accept(); err == nil {
			accepted <- c
		}
	}()
	require.True(t, s.Watch(ln2.Addr().String()))
	done := make(chan struct{})
	go func() { s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the open sentinel")
	}
	s.Close() // idempotent
}
