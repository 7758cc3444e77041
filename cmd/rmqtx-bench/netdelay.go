package main

// A network between every side and the services (-net-delay): delay proxies
// on loopback in front of the database, the name server and every broker the
// name server names. On one machine every side talks to the services over
// loopback, where a round trip costs microseconds and the statements and
// frames a Send needs cost almost nothing; a real network makes every round
// trip count, and overlaps (rmqtx begins its local transaction while the half
// message is in flight) start to pay. The proxies add the same delay to every
// side, each way.

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// proxyChunk is the most a proxy reads at once; each chunk read is written
// on after the delay, in order.
const proxyChunk = 32 << 10

// maxRemotingFrame bounds a remoting frame the name server proxy buffers
// (the remoting codec's limit).
const maxRemotingFrame = 64 << 20

// delayProxy forwards every TCP connection it accepts on a loopback port to
// target and delivers every chunk of bytes, in each direction, no earlier
// than delay after it was read: a delayed copy loop per direction, so a
// connection's throughput is not bounded by the delay, only its round trips.
type delayProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	// frames, when set, reads what target sends as remoting frames and
	// passes each through it before the delay (the name server proxy).
	frames func(frame []byte) []byte

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
	// live counts the proxy's goroutines (Close waits for them; the tests
	// check it is 0 afterwards).
	live atomic.Int64
	// chunks and bytes count what was forwarded, both directions; lateNs
	// sums how long after its due time each chunk was written.
	chunks, bytes, lateNs atomic.Int64
	clock                 *delayClock
}

// startDelayProxy listens on 127.0.0.1:<ephemeral> and forwards to target,
// which must be a loopback address.
func startDelayProxy(target string, delay time.Duration, frames func([]byte) []byte) (*delayProxy, error) {
	if err := checkLoopbackAddr(target); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("net-delay: listen: %w", err)
	}
	p := &delayProxy{ln: ln, target: target, delay: delay, frames: frames, conns: map[net.Conn]struct{}{}, clock: startDelayClock()}
	p.goLive(p.accept)
	return p, nil
}

// checkLoopbackAddr refuses a host:port that is not an IP on loopback.
func checkLoopbackAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("net-delay: address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("net-delay: %s is not a loopback address; the bench only proxies 127.0.0.1", addr)
	}
	return nil
}

// Addr is the proxy's listening address.
func (p *delayProxy) Addr() string { return p.ln.Addr().String() }

// goLive runs f on a goroutine that Close waits for.
func (p *delayProxy) goLive(f func()) {
	p.wg.Add(1)
	p.live.Add(1)
	go func() {
		defer p.wg.Done()
		defer p.live.Add(-1)
		f()
	}()
}

// track registers c so Close can close it; false when the proxy is closed.
func (p *delayProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *delayProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *delayProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // the listener is closed
		}
		if !p.track(c) {
			_ = c.Close()
			return
		}
		p.goLive(func() { p.serve(c) })
	}
}

// serve dials target for client connection c and runs both directions until
// both have ended.
func (p *delayProxy) serve(c net.Conn) {
	defer func() { _ = c.Close(); p.untrack(c) }()
	d := net.Dialer{Timeout: 5 * time.Second}
	u, err := d.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer func() { _ = u.Close(); p.untrack(u) }()
	if !p.track(u) {
		return
	}
	up := chunkReader(c)
	down := chunkReader(u)
	if p.frames != nil {
		down = frameReader(bufio.NewReaderSize(u, proxyChunk), p.frames)
	}
	done := make(chan struct{})
	p.goLive(func() { defer close(done); p.pipe(c, u, up) })
	p.pipe(u, c, down)
	<-done
}

// pipe moves what next reads from src to dst, each chunk written no earlier
// than p.delay after it was read, in order. A reader goroutine (this one)
// stamps the chunks; a writer goroutine sleeps until each is due, so chunks
// read close together stay close together. When src ends, dst's write side
// is closed (the peer sees EOF); when a write fails, both connections are
// closed so the other direction ends too.
func (p *delayProxy) pipe(src, dst net.Conn, next func() ([]byte, error)) {
	type chunk struct {
		b   []byte
		due time.Time
	}
	ch := make(chan chunk, 256)
	wrote := make(chan struct{})
	p.goLive(func() {
		defer close(wrote)
		failed := false
		sig := make(chan struct{}, 1)
		for c := range ch {
			if failed {
				continue // keep draining: the reader must never block on a dead writer
			}
			p.clock.wait(c.due, sig)
			p.lateNs.Add(int64(time.Since(c.due)))
			if _, err := dst.Write(c.b); err != nil {
				failed = true
				_ = src.Close()
				_ = dst.Close()
				continue
			}
			p.chunks.Add(1)
			p.bytes.Add(int64(len(c.b)))
		}
		if !failed {
			closeWrite(dst)
		}
	})
	for {
		b, err := next()
		if len(b) > 0 {
			ch <- chunk{b: b, due: time.Now().Add(p.delay)}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				_ = dst.Close() // a broken stream: the other side must not wait for the rest
			}
			break
		}
	}
	close(ch)
	<-wrote
}

// closeWrite half-closes c when it can, else closes it.
func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

// chunkReader reads whatever is available, up to proxyChunk bytes, as one
// chunk.
func chunkReader(r io.Reader) func() ([]byte, error) {
	buf := make([]byte, proxyChunk)
	return func() ([]byte, error) {
		n, err := r.Read(buf)
		if n == 0 {
			return nil, err
		}
		return append([]byte(nil), buf[:n]...), err
	}
}

// frameReader reads whole remoting frames (a 4-byte big-endian length, then
// that many bytes) and passes each through rewrite.
func frameReader(r *bufio.Reader, rewrite func([]byte) []byte) func() ([]byte, error) {
	return func() ([]byte, error) {
		var head [4]byte
		if _, err := io.ReadFull(r, head[:]); err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				return nil, fmt.Errorf("net-delay: truncated frame: %w", err)
			}
			return nil, err
		}
		n := binary.BigEndian.Uint32(head[:])
		if n > maxRemotingFrame {
			return nil, fmt.Errorf("net-delay: frame length %d out of range", n)
		}
		f := make([]byte, 4+int(n))
		copy(f, head[:])
		if _, err := io.ReadFull(r, f[4:]); err != nil {
			return nil, fmt.Errorf("net-delay: truncated frame: %w", err)
		}
		return rewrite(f), nil
	}
}

// Close stops accepting, closes every connection and waits for every
// goroutine of the proxy. It may be called more than once.
func (p *delayProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
	p.clock.stop() // after the writers: they wait on it
}

// appliedDelay is the mean delay the proxy added to a chunk so far (the
// requested delay plus the mean lateness of the wake-ups).
func (p *delayProxy) appliedDelay() time.Duration {
	n := p.chunks.Load()
	if n == 0 {
		return 0
	}
	return p.delay + time.Duration(p.lateNs.Load()/n)
}

// delayClock wakes waiting writers at their due times with preciseSleep,
// one at a time, in the order they asked. Every chunk of a proxy waits the
// same delay, so due times arrive (nearly) in order; a waiter queued behind
// a later one is released at once when its turn comes, never early. One
// goroutine sleeps per proxy, instead of a runtime timer per chunk, which
// an idle process rounds up to a whole millisecond.
type delayClock struct {
	mu    sync.Mutex
	queue []clockWaiter
	wake  chan struct{}
	quit  chan struct{}
	done  chan struct{}
}

type clockWaiter struct {
	due time.Time
	sig chan struct{}
}

func startDelayClock() *delayClock {
	c := &delayClock{wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

// wait returns at due or later; sig is the caller's own channel (capacity
// 1), reused across calls.
func (c *delayClock) wait(due time.Time, sig chan struct{}) {
	if !time.Now().Before(due) {
		return
	}
	c.mu.Lock()
	c.queue = append(c.queue, clockWaiter{due: due, sig: sig})
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
	<-sig
}

func (c *delayClock) run() {
	defer close(c.done)
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.mu.Unlock()
			select {
			case <-c.wake:
				continue
			case <-c.quit:
				return
			}
		}
		w := c.queue[0]
		c.queue[0] = clockWaiter{}
		c.queue = c.queue[1:]
		c.mu.Unlock()
		preciseSleep(time.Until(w.due))
		w.sig <- struct{}{}
	}
}

// stop ends the clock once nobody waits on it; it may be called more than
// once.
func (c *delayClock) stop() {
	select {
	case <-c.quit:
	default:
		close(c.quit)
	}
	<-c.done
}

// The name server's answers name brokers: GET_ROUTEINFO_BY_TOPIC's
// "brokerDatas" and GET_BROKER_CLUSTER_INFO's "brokerAddrTable" each hold
// "brokerAddrs":{0:"127.0.0.1:10911"} (integer keys, unquoted by the name
// server; quoted by other writers).
var (
	nsBrokerAddrsRE = regexp.MustCompile(`"brokerAddrs"\s*:\s*\{([^}]*)\}`)
	nsAddrEntryRE   = regexp.MustCompile(`"?\d+"?\s*:\s*"([^"]+)"`)
)

// rewriteBrokerAddrs returns frame, a whole remoting frame (length prefix
// included) from the name server, with every address in its body's
// "brokerAddrs" maps replaced by addr(old) and the length prefix fixed. The
// header (its length and serialization type in bytes 4..8) is kept as it
// is. A frame without broker addresses is returned unchanged.
func rewriteBrokerAddrs(frame []byte, addr func(string) string) []byte {
	if len(frame) < 8 {
		return frame
	}
	hl := int(binary.BigEndian.Uint32(frame[4:8]) & 0xFFFFFF)
	if 8+hl > len(frame) {
		return frame
	}
	body := frame[8+hl:]
	if !bytes.Contains(body, []byte(`"brokerAddrs"`)) {
		return frame
	}
	var nb []byte
	last := 0
	for _, m := range nsBrokerAddrsRE.FindAllSubmatchIndex(body, -1) {
		inner := body[m[2]:m[3]]
		for _, e := range nsAddrEntryRE.FindAllSubmatchIndex(inner, -1) {
			s, t := m[2]+e[2], m[2]+e[3] // the address inside body
			nb = append(nb, body[last:s]...)
			nb = append(nb, addr(string(body[s:t]))...)
			last = t
		}
	}
	nb = append(nb, body[last:]...)
	out := make([]byte, 0, 8+hl+len(nb))
	out = append(out, frame[:8+hl]...)
	out = append(out, nb...)
	binary.BigEndian.PutUint32(out[0:4], uint32(len(out)-4))
	return out
}

// netDelay is the run's set of delay proxies: the database's, the name
// server's (rewriting broker addresses) and one per broker address the name
// server names, started when it first does.
type netDelay struct {
	delay time.Duration
	db    *delayProxy
	ns    *delayProxy

	mu       sync.Mutex
	brokers  map[string]*delayProxy // real address -> its proxy
	closed   bool
	warnings []string
}

// startNetDelay starts the database's and the name server's proxies.
func startNetDelay(dbAddr, nsAddr string, delay time.Duration) (*netDelay, error) {
	n := &netDelay{delay: delay, brokers: map[string]*delayProxy{}}
	var err error
	if n.db, err = startDelayProxy(dbAddr, delay, nil); err != nil {
		return nil, fmt.Errorf("net-delay: database proxy: %w", err)
	}
	if n.ns, err = startDelayProxy(nsAddr, delay, func(f []byte) []byte { return rewriteBrokerAddrs(f, n.brokerAddr) }); err != nil {
		n.db.Close()
		return nil, fmt.Errorf("net-delay: name server proxy: %w", err)
	}
	return n, nil
}

// brokerAddr returns the address of real's delay proxy, starting it on
// first use. An address that cannot be proxied (not on loopback, or after
// Close) is returned unchanged and recorded in Warnings.
func (n *netDelay) brokerAddr(real string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p, ok := n.brokers[real]; ok {
		return p.Addr()
	}
	if n.closed {
		return real
	}
	p, err := startDelayProxy(real, n.delay, nil)
	if err != nil {
		n.warnings = append(n.warnings, fmt.Sprintf("broker %s not proxied: %v", real, err))
		n.brokers[real] = nil
		return real
	}
	n.brokers[real] = p
	return p.Addr()
}

// Warnings are the broker addresses left unproxied.
func (n *netDelay) Warnings() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.warnings...)
}

// Summary describes the proxies and what they forwarded, for the notes.
func (n *netDelay) Summary() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := fmt.Sprintf("delay %s each way; database proxy %s: %d chunks, mean delay applied %s; name server proxy %s: %d chunks",
		n.delay, n.db.Addr(), n.db.chunks.Load(), n.db.appliedDelay().Round(time.Microsecond), n.ns.Addr(), n.ns.chunks.Load())
	reals := make([]string, 0, len(n.brokers))
	for real := range n.brokers {
		reals = append(reals, real)
	}
	sort.Strings(reals)
	for _, real := range reals {
		if p := n.brokers[real]; p != nil {
			s += fmt.Sprintf("; broker %s via %s: %d chunks, mean delay applied %s", real, p.Addr(), p.chunks.Load(), p.appliedDelay().Round(time.Microsecond))
		}
	}
	return s
}

// Close closes the name server's proxy first (no new broker proxies), then
// the brokers' and the database's, and waits for all their goroutines.
func (n *netDelay) Close() {
	n.ns.Close()
	n.mu.Lock()
	n.closed = true
	brokers := n.brokers
	n.brokers = map[string]*delayProxy{}
	n.mu.Unlock()
	for _, p := range brokers {
		if p != nil {
			p.Close()
		}
	}
	n.db.Close()
}
