package remoting

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

// Pool keeps connections to brokers open for requests on a hot path (a
// Send's END_TRANSACTION), where a fresh connection per request (RoundTrip)
// would cost a handshake each time. A connection carries one request at a
// time; concurrent requests to one broker use as many connections. The
// broker never sends a request of its own on them: they never heartbeat,
// so the broker does not know them as a client's channels.
//
// A request is never sent twice: when a connection fails, the request's
// outcome is unknown to the caller, who must not assume either (an
// END_TRANSACTION sent twice would store its message twice).
type Pool struct {
	// IdleTimeout closes a connection idle for longer, before the broker
	// closes it (its default is 120 s). Default 60 s.
	IdleTimeout time.Duration
	// MaxIdle is the number of idle connections kept per address. Default 8.
	MaxIdle int

	mu     sync.Mutex
	idle   map[string][]*pooled
	closed bool
}

type pooled struct {
	c    net.Conn
	r    *bufio.Reader
	used time.Time

	// While idle, a watcher reads from the connection: the broker sends
	// nothing unasked, so anything it reads (the broker closed it, or
	// died) ends the connection at once. A connection left open on this
	// side after the broker died holds the broker's side of it open too
	// (FIN_WAIT_2), which delayed the broker's restart by about 10 s.
	watchDone chan struct{}
	dead      bool // set by the watcher before watchDone closes
}

// watch starts the idle watcher; p is told when the connection dies.
func (c *pooled) watch(p *Pool, addr string) {
	c.watchDone = make(chan struct{})
	_ = c.c.SetReadDeadline(time.Time{})
	go func() {
		defer close(c.watchDone)
		_, err := c.r.Peek(1)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return // unwatch: the connection is being taken
		}
		c.dead = true
		_ = c.c.Close()
		p.drop(addr, c)
	}()
}

// unwatch stops the idle watcher and reports whether the connection is
// still usable.
func (c *pooled) unwatch() bool {
	if c.watchDone == nil {
		return true
	}
	_ = c.c.SetReadDeadline(time.Now())
	<-c.watchDone
	c.watchDone = nil
	_ = c.c.SetReadDeadline(time.Time{})
	return !c.dead
}

// RoundTrip sends one request to addr on an idle connection of the pool,
// or a new one, and reads its response (timeout <= 0 means 5 s). The
// connection goes back to the pool only after a complete exchange.
func (p *Pool) RoundTrip(ctx context.Context, addr string, timeout time.Duration, code int, ext map[string]string) (Header, []byte, error) {
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := p.get(ctx, addr)
	if err != nil {
		return Header{}, nil, err
	}
	h, body, err := exchange(ctx, c.c, c.r, addr, code, ext)
	if err != nil {
		_ = c.c.Close()
		return Header{}, nil, err
	}
	_ = c.c.SetDeadline(time.Time{})
	p.put(addr, c)
	return h, body, nil
}

func (p *Pool) get(ctx context.Context, addr string) (*pooled, error) {
	idleFor := p.IdleTimeout
	if idleFor <= 0 {
		idleFor = 60 * time.Second
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, fmt.Errorf("remoting: pool closed")
	}
	for list := p.idle[addr]; len(list) > 0; list = p.idle[addr] {
		c := list[len(list)-1]
		p.idle[addr] = list[:len(list)-1]
		p.mu.Unlock()
		if c.unwatch() && time.Since(c.used) < idleFor {
			return c, nil
		}
		_ = c.c.Close()
		p.mu.Lock()
	}
	p.mu.Unlock()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("remoting: dial %s: %w", addr, err)
	}
	return &pooled{c: conn, r: bufio.NewReader(conn)}, nil
}

func (p *Pool) put(addr string, c *pooled) {
	maxIdle := p.MaxIdle
	if maxIdle <= 0 {
		maxIdle = 8
	}
	c.used = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.idle[addr]) >= maxIdle {
		_ = c.c.Close()
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*pooled{}
	}
	p.idle[addr] = append(p.idle[addr], c)
	c.watch(p, addr)
}

// drop removes c from the idle connections of addr, if it is there.
func (p *Pool) drop(addr string, c *pooled) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[addr]
	for i, x := range list {
		if x == c {
			p.idle[addr] = append(list[:i:i], list[i+1:]...)
			return
		}
	}
}

// Forget closes the idle connections to addr (a broker that moved or
// restarted).
func (p *Pool) Forget(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.idle[addr] {
		_ = c.c.Close()
	}
	delete(p.idle, addr)
}

// Close closes every idle connection; requests in flight finish and close
// theirs. It is idempotent.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for addr, list := range p.idle {
		for _, c := range list {
			_ = c.c.Close()
		}
		delete(p.idle, addr)
	}
}
