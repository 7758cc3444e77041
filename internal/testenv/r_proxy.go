package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
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
}

// NewCutProxy starts a proxy to target (host:port), closed when the test ends.
func NewCutProxy(t testing.TB, target string) *CutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy listen: %v", err)
	}
	p := &CutProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
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
	go pipe(out, in)
	go pipe(in, out)
	<-done
	p.untrack(in, out) // closing both ends stops the other copy
	<-done
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
