package remoting

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeBroker answers every request with code 0 and the request's opaque
// (or a wrong one when skew is set), and counts the connections it
// accepted.
type fakeBroker struct {
	ln     net.Listener
	conns  atomic.Int32
	reqs   atomic.Int32
	skew   atomic.Bool
	hangUp atomic.Bool // close each connection after its answer
}

func newFakeBroker(t *testing.T) *fakeBroker {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeBroker{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.conns.Add(1)
			go f.serve(c)
		}
	}()
	return f
}

func (f *fakeBroker) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		var lb [4]byte
		if _, err := io.ReadFull(r, lb[:]); err != nil {
			return
		}
		buf := make([]byte, binary.BigEndian.Uint32(lb[:]))
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		var h Header
		if json.Unmarshal(buf[4:4+int(binary.BigEndian.Uint32(buf[0:4])&0xFFFFFF)], &h) != nil {
			return
		}
		f.reqs.Add(1)
		resp := Header{Code: ResSuccess, Opaque: h.Opaque, Flag: 1}
		if f.skew.Load() {
			resp.Opaque++
		}
		hb, _ := json.Marshal(resp)
		frame := make([]byte, 8+len(hb))
		binary.BigEndian.PutUint32(frame[0:4], uint32(4+len(hb)))
		binary.BigEndian.PutUint32(frame[4:8], uint32(len(hb)))
		copy(frame[8:], hb)
		if _, err := c.Write(frame); err != nil {
			return
		}
		if f.hangUp.Load() {
			return
		}
	}
}

// The pool reuses a connection for sequential requests, opens more for
// concurrent ones, drops a connection whose answer is out of step (and
// never resends the request), and does not reuse a connection idle for
// longer than IdleTimeout.
func TestPool(t *testing.T) {
	t.Parallel()
	f := newFakeBroker(t)
	addr := f.ln.Addr().String()
	ctx := context.Background()
	p := &Pool{}
	defer p.Close()
	for i := 0; i < 5; i++ {
		h, _, err := p.RoundTrip(ctx, addr, time.Second, 37, map[string]string{"k": "v"})
		require.NoError(t, err)
		require.Equal(t, ResSuccess, h.Code)
	}
	require.EqualValues(t, 1, f.conns.Load(), "sequential requests share one connection")

	f.skew.Store(true)
	_, _, err := p.RoundTrip(ctx, addr, time.Second, 37, nil)
	require.True(t, errors.Is(err, errOutOfStep), "%v", err)
	require.EqualValues(t, 6, f.reqs.Load(), "the request was sent once")
	f.skew.Store(false)
	_, _, err = p.RoundTrip(ctx, addr, time.Second, 37, nil)
	require.NoError(t, err)
	require.EqualValues(t, 2, f.conns.Load(), "the out-of-step connection was closed")

	idle := &Pool{IdleTimeout: time.Nanosecond}
	defer idle.Close()
	for i := 0; i < 2; i++ {
		_, _, err := idle.RoundTrip(ctx, addr, time.Second, 37, nil)
		require.NoError(t, err)
	}
	require.EqualValues(t, 4, f.conns.Load(), "an idle connection past IdleTimeout is not reused")

	p.Close()
	_, _, err = p.RoundTrip(ctx, addr, time.Second, 37, nil)
	require.Error(t, err, "a closed pool refuses requests")
}

// A connection the broker closes while it is idle is closed on this side
// at once and leaves the pool: left open, it would hold the broker's side
// open too (FIN_WAIT_2) after a broker died.
func TestPoolDropsConnectionsTheBrokerClosed(t *testing.T) {
	t.Parallel()
	f := newFakeBroker(t)
	f.hangUp.Store(true)
	addr := f.ln.Addr().String()
	p := &Pool{}
	defer p.Close()
	_, _, err := p.RoundTrip(context.Background(), addr, time.Second, 37, nil)
	require.NoError(t, err)
	idle := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.idle[addr])
	}
	deadline := time.Now().Add(5 * time.Second)
	for idle() != 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polls the condition, bounded
	}
	require.Zero(t, idle(), "the closed connection left the pool")
	_, _, err = p.RoundTrip(context.Background(), addr, time.Second, 37, nil)
	require.NoError(t, err, "the next request opens a new connection")
	require.EqualValues(t, 2, f.conns.Load())
}
