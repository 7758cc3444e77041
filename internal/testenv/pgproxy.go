package testenv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// PGProxy is NewMySQLProxy for PostgreSQL client connections without
// encryption (the test DSN's sslmode=disable: no SSLRequest, whose one-byte
// answer is no message): a CutProxy that forwards whole protocol messages
// and can lose the answer to one COMMIT (LoseCommitAnswer, or
// HoleCommitAnswer) or black-hole every connection (BlackHole). Start it in
// front of PGAddr and open a pool through it with PoolVia.
type PGProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	holes holes
	lose  atomic.Pointer[loseArm[PGLostCommit]]
}

// PGLostCommit is the answer a PGProxy read and dropped: the command tag of
// the server's CommandComplete for the COMMIT.
type PGLostCommit struct {
	Tag string
}

// OK reports whether the server committed: PostgreSQL answers a COMMIT of
// an aborted transaction with the tag ROLLBACK.
func (l PGLostCommit) OK() bool { return l.Tag == "COMMIT" }

// NewPGProxy starts a PGProxy to target (host:port), closed when the test
// ends.
func NewPGProxy(t testing.TB, target string) *PGProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: proxy listen: %v", err)
	}
	p := &PGProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's listening address.
func (p *PGProxy) Addr() string { return p.ln.Addr().String() }

// LoseCommitAnswer arms the proxy for one COMMIT: the next simple-query
// "COMMIT" a client sends through it (pgx sends Tx.Commit so) is forwarded;
// the server's answer, up to its ReadyForQuery, is read and dropped, and
// the proxy then cuts (every connection through it is closed and new ones
// are refused until Restore). The client sees its connection end with the
// COMMIT's outcome unknown, while the server has already decided it. The
// returned channel receives the dropped answer before the cut, so it holds
// it by the time the client sees the cut.
func (p *PGProxy) LoseCommitAnswer(t testing.TB) <-chan PGLostCommit {
	t.Helper()
	arm := &loseArm[PGLostCommit]{ch: make(chan PGLostCommit, 1)}
	p.lose.Store(arm)
	return arm.ch
}

// HoleCommitAnswer is LoseCommitAnswer with a black hole instead of a cut
// (CutProxy.HoleCommitAnswer): the answer is dropped and the proxy then
// black-holes, leaving the client waiting on an open socket.
func (p *PGProxy) HoleCommitAnswer(t testing.TB) <-chan PGLostCommit {
	t.Helper()
	arm := &loseArm[PGLostCommit]{ch: make(chan PGLostCommit, 1), hole: true}
	p.lose.Store(arm)
	return arm.ch
}

// BlackHole stops every byte through the proxy without closing anything,
// as CutProxy.BlackHole does; Cut ends it.
func (p *PGProxy) BlackHole() { p.holes.blackHole() }

// ServerPorts are the local ports of the proxy's connections to the server
// held in a black hole (CutProxy.ServerPorts).
func (p *PGProxy) ServerPorts() []int {
	return p.holes.heldPorts()
}

// Cut closes every open connection and refuses new ones until Restore. It
// ends a black hole too.
func (p *PGProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.holes.open()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Restore lets new connections through again; connections held in a
// black hole stay held (BlackHole).
func (p *PGProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.holes.open()
}

func (p *PGProxy) close() {
	_ = p.ln.Close()
	p.Cut()
	p.wg.Wait()
}

func (p *PGProxy) track(cs ...net.Conn) bool {
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

func (p *PGProxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

func (p *PGProxy) accept() {
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

func (p *PGProxy) serve(in net.Conn) {
	defer p.wg.Done()
	if p.holes.swallow() {
		drain(in) // accepted into the black hole: held open, never connected on
		p.untrack(in)
		return
	}
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
	held := p.holes.add(out)
	defer p.holes.remove(out)
	done := make(chan struct{}, 2)
	var lose atomic.Pointer[loseArm[PGLostCommit]] // set once this connection's COMMIT went out
	go func() { p.clientToServer(out, in, &lose, held); done <- struct{}{} }()
	go func() { p.serverToClient(in, out, &lose, held); done <- struct{}{} }()
	<-done
	if !held.Load() {
		p.untrack(in, out) // closing both ends stops the other copy
	}
	// In a black hole the other side is not told (CutProxy.serve).
	<-done
	p.untrack(in, out)
}

// readPGMessage reads one message: with typed, a type byte, then a
// big-endian int32 length that counts itself, then the body; without (the
// client's first message: startup, SSL or cancel request), the length and
// body alone. It returns the message whole.
func readPGMessage(r io.Reader, typed bool) ([]byte, error) {
	h := make([]byte, 5)
	if !typed {
		h = h[1:]
	}
	if _, err := io.ReadFull(r, h); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(h[len(h)-4:]))
	if n < 4 || n > 1<<30 {
		return nil, fmt.Errorf("testenv: bad message length %d", n)
	}
	msg := make([]byte, len(h)+n-4)
	copy(msg, h)
	if _, err := io.ReadFull(r, msg[len(h):]); err != nil {
		return nil, err
	}
	return msg, nil
}

// isPGCommit reports whether msg is a simple Query "COMMIT".
func isPGCommit(msg []byte) bool {
	return len(msg) > 5 && msg[0] == 'Q' &&
		bytes.EqualFold(bytes.TrimSpace(bytes.TrimRight(msg[5:], "\x00")), []byte("COMMIT"))
}

// clientToServer forwards the client's messages. When LoseCommitAnswer is
// armed and a COMMIT passes, it marks this connection before forwarding it,
// so that serverToClient drops the answer.
func (p *PGProxy) clientToServer(server, client net.Conn, lose *atomic.Pointer[loseArm[PGLostCommit]], held *atomic.Bool) {
	typed := false
	for {
		msg, err := readPGMessage(client, typed)
		if err != nil {
			return
		}
		typed = true // after the startup message
		if held.Load() {
			continue
		}
		if isPGCommit(msg) {
			if arm := p.lose.Swap(nil); arm != nil {
				lose.Store(arm)
			}
		}
		if _, err := server.Write(msg); err != nil {
			return
		}
	}
}

// serverToClient forwards the server's messages, except the answer to a
// COMMIT whose answer is to be lost: its messages up to ReadyForQuery are
// read, the command tag is handed to the test, and the proxy cuts instead
// of forwarding them.
func (p *PGProxy) serverToClient(client, server net.Conn, lose *atomic.Pointer[loseArm[PGLostCommit]], held *atomic.Bool) {
	for {
		msg, err := readPGMessage(server, true)
		if err != nil {
			return
		}
		if held.Load() {
			continue
		}
		if arm := lose.Swap(nil); arm != nil {
			var tag string
			for {
				if msg[0] == 'C' {
					tag = string(bytes.TrimRight(msg[5:], "\x00"))
				}
				if msg[0] == 'Z' {
					break
				}
				if msg, err = readPGMessage(server, true); err != nil {
					break
				}
			}
			if arm.hole {
				p.BlackHole()
				arm.ch <- PGLostCommit{Tag: tag}
				continue
			}
			// Handed over before the cut: the client learns nothing until
			// the cut, so a test that reads the channel once Send has
			// returned always finds the answer there.
			arm.ch <- PGLostCommit{Tag: tag}
			p.Cut()
			return
		}
		if _, err := client.Write(msg); err != nil {
			return
		}
	}
}
