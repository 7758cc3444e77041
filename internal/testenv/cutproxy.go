package testenv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// CutProxy is a TCP proxy on loopback that a test can cut and restore: a
// real network fault between one component and a real service, without
// touching the service that other tests share. While cut, open connections
// are closed and new ones are accepted and closed at once, so clients fail
// fast (connection reset / EOF) instead of waiting for a timeout.
type CutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup

	// mysql: the proxy reads the MySQL/MariaDB protocol's packets (see
	// NewMySQLProxy); lose is the armed LoseCommitAnswer, if any.
	mysql bool
	lose  atomic.Pointer[chan LostCommit]
}

// NewCutProxy starts a proxy to target (host:port), closed when the test ends.
func NewCutProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	return newCutProxy(t, target, false)
}

// NewMySQLProxy is NewCutProxy for MariaDB/MySQL client connections (no
// TLS, no compression: the test DSNs): it forwards whole protocol packets
// and can lose the answer to one COMMIT (LoseCommitAnswer).
func NewMySQLProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	return newCutProxy(t, target, true)
}

func newCutProxy(t testing.TB, target string, mysql bool) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy listen: %v", err)
	}
	p := &CutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, mysql: mysql}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// LostCommit is what a MySQL proxy did with the COMMIT it lost the answer
// of: the server's answer (its first packet's payload), read and dropped.
type LostCommit struct {
	Answer []byte
}

// OK reports whether the server answered the COMMIT with an OK packet: the
// transaction committed, and its client never learned it.
func (l LostCommit) OK() bool { return len(l.Answer) > 0 && l.Answer[0] == 0x00 }

// LoseCommitAnswer arms a NewMySQLProxy for one COMMIT: the next COMMIT a
// client sends through it (a COM_QUERY packet "COMMIT", as database/sql's
// Tx.Commit sends it) is forwarded to the server; the server's answer is
// read and dropped, and the proxy then cuts (as Cut: every connection
// through it is closed and new ones are refused until Restore). The client
// sees its connection end with the COMMIT's outcome unknown, while the
// server has already decided it. The returned channel receives the dropped
// answer. The cut is exact: nothing is closed before the server answered,
// and not one byte of the answer reaches the client.
func (p *CutProxy) LoseCommitAnswer(t testing.TB) <-chan LostCommit {
	t.Helper()
	if !p.mysql {
		t.Fatalf("testenv: LoseCommitAnswer needs a NewMySQLProxy")
	}
	ch := make(chan LostCommit, 1)
	p.lose.Store(&ch)
	return ch
}

// Addr is the proxy's listening address.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and refuses new ones until Restore.
func (p *CutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets connections through again.
func (p *CutProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
}

func (p *CutProxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

// track registers c unless the proxy is cut.
func (p *CutProxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *CutProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *CutProxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		if !p.track(in) {
			_ = in.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(in)
	}
}

func (p *CutProxy) serve(in net.Conn) {
	defer p.wg.Done()
	out, err := net.Dial("tcp", p.target)
	if err != nil {
		p.untrack(in)
		return
	}
	if !p.track(out) {
		_ = out.Close()
		p.untrack(in)
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	if p.mysql {
		var lose atomic.Pointer[chan LostCommit] // set once this connection's COMMIT went out
		go func() { p.clientToServer(out, in, &lose); done <- struct{}{} }()
		go func() { p.serverToClient(in, out, &lose); done <- struct{}{} }()
	} else {
		go pipe(out, in)
		go pipe(in, out)
	}
	<-done
	p.untrack(in, out) // closing both ends stops the other copy
	<-done
}

// readPacket reads one MySQL protocol packet: a 3-byte little-endian
// payload length, a sequence id, the payload. It returns the packet whole.
func readPacket(r io.Reader) ([]byte, error) {
	var h [4]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	n := int(binary.LittleEndian.Uint32(append(h[:3:3], 0)))
	pkt := make([]byte, 4+n)
	copy(pkt, h[:])
	if _, err := io.ReadFull(r, pkt[4:]); err != nil {
		return nil, err
	}
	return pkt, nil
}

// isCommit reports whether pkt is a client command COM_QUERY "COMMIT"
// (sequence id 0 starts every command; handshake packets have others).
func isCommit(pkt []byte) bool {
	const comQuery = 0x03
	return len(pkt) > 5 && pkt[3] == 0 && pkt[4] == comQuery &&
		bytes.EqualFold(bytes.TrimSpace(pkt[5:]), []byte("COMMIT"))
}

// clientToServer forwards the client's packets. When LoseCommitAnswer is
// armed and a COMMIT passes, it marks this connection before forwarding it,
// so that serverToClient drops the answer.
func (p *CutProxy) clientToServer(server, client net.Conn, lose *atomic.Pointer[chan LostCommit]) {
	for {
		pkt, err := readPacket(client)
		if err != nil {
			return
		}
		if isCommit(pkt) {
			if ch := p.lose.Swap(nil); ch != nil {
				lose.Store(ch)
			}
		}
		if _, err := server.Write(pkt); err != nil {
			return
		}
	}
}

// serverToClient forwards the server's packets, except the answer to a
// COMMIT whose answer is to be lost: that packet is read, handed to the
// test, and the proxy cuts instead of forwarding it.
func (p *CutProxy) serverToClient(client, server net.Conn, lose *atomic.Pointer[chan LostCommit]) {
	for {
		pkt, err := readPacket(server)
		if err != nil {
			return
		}
		if ch := lose.Load(); ch != nil {
			p.Cut()
			*ch <- LostCommit{Answer: pkt[4:]}
			return
		}
		if _, err := client.Write(pkt); err != nil {
			return
		}
	}
}

// DBVia opens a second pool on db's database that connects through addr
// (a CutProxy), closed when the test ends.
func DBVia(t testing.TB, db *sqlx.DB, addr string) *sqlx.DB {
	t.Helper()
	return openVariant(t, db, func(c *mysql.Config) { c.Addr = addr })
}

func openVariant(t testing.TB, db *sqlx.DB, mod func(*mysql.Config)) *sqlx.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(Load().DSN(DBName(t, db)))
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	mod(cfg)
	out, err := sqlx.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	out.SetMaxOpenConns(16)
	t.Cleanup(func() { _ = out.Close() })
	return out
}
