package testenv

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/dialect"
)

// CutProxy is a TCP proxy on loopback that a test can cut and restore: a
// real network fault between one component and a real service, without
// touching the service that other tests share. While cut, open connections
// are closed and new ones are accepted and closed at once, so clients fail
// fast (connection reset / EOF) instead of waiting for a timeout.
//
// It can also black-hole (BlackHole): the other network fault, a partition
// that sends no reset. Every socket stays open and nothing flows: what
// either side sends is read and dropped, a side that closes is not told to
// the other, and new connections are accepted and held without reaching
// the service. A client then waits for its own timeouts, and the server
// keeps the session (and the open transaction's locks) until it ends it
// itself: EndServerSessions does that on demand.
type CutProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
	holes holes

	// mysql: the proxy reads the MySQL/MariaDB protocol's packets (see
	// NewMySQLProxy); lose is the armed LoseCommitAnswer, if any.
	mysql bool
	lose  atomic.Pointer[loseArm[LostCommit]]
}

// loseArm is an armed LoseCommitAnswer or HoleCommitAnswer: where the
// dropped answer goes, and whether the proxy then black-holes instead of
// cutting.
type loseArm[T any] struct {
	ch   chan T
	hole bool
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
// answer before the cut, so it holds it by the time the client sees the
// cut. The cut is exact: nothing is closed before the server answered,
// and not one byte of the answer reaches the client.
func (p *CutProxy) LoseCommitAnswer(t testing.TB) <-chan LostCommit {
	t.Helper()
	return p.armLose(t, false)
}

// HoleCommitAnswer is LoseCommitAnswer with a black hole instead of a cut:
// the server's answer to the next COMMIT is read and dropped, and the proxy
// then black-holes (BlackHole). The client is left waiting for an answer
// that never comes, on a socket that stays open, as behind a partition
// that fell between the COMMIT and its answer.
func (p *CutProxy) HoleCommitAnswer(t testing.TB) <-chan LostCommit {
	t.Helper()
	return p.armLose(t, true)
}

func (p *CutProxy) armLose(t testing.TB, hole bool) <-chan LostCommit {
	t.Helper()
	if !p.mysql {
		t.Fatalf("testenv: losing a COMMIT answer needs a NewMySQLProxy")
	}
	arm := &loseArm[LostCommit]{ch: make(chan LostCommit, 1), hole: hole}
	p.lose.Store(arm)
	return arm.ch
}

// Addr is the proxy's listening address.
func (p *CutProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every open connection and refuses new ones until Restore. It
// ends a black hole too: the clients held in it see their connections end.
func (p *CutProxy) Cut() {
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
func (p *CutProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.holes.open()
}

// BlackHole stops every byte through the proxy without closing anything:
// open connections stay open on both sides and what is sent on them is
// dropped; a side that closes is not told to the other; new connections
// are accepted and held, never reaching the service. Restore lets new
// connections through again and leaves the held ones held (a partition
// that healed for new sessions, while the server keeps the old ones until
// it ends them: EndServerSessions); Cut closes everything. A connection that
// was black-holed never carries traffic again: its protocol stream lost
// bytes.
func (p *CutProxy) BlackHole() { p.holes.blackHole() }

// ServerPorts are the local ports of the proxy's connections to the service
// that are held in a black hole: the client ports the server sees for the
// sessions it keeps for clients it cannot reach (EndServerSessions).
func (p *CutProxy) ServerPorts() []int {
	return p.holes.heldPorts()
}

// holes is the black hole of one proxy: whether it swallows new
// connections, and per open connection to the service whether that one is
// held in it. BlackHole holds every open connection; Restore lets new ones
// through again but leaves the held ones held: the partition healed for
// new sessions, while the server never learned that the old ones' clients
// are gone (Cut ends those).
type holes struct {
	mu   sync.Mutex
	on   bool
	outs map[net.Conn]*atomic.Bool
}

// add registers out, a new connection to the service, and returns its
// held flag.
func (h *holes) add(out net.Conn) *atomic.Bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.outs == nil {
		h.outs = map[net.Conn]*atomic.Bool{}
	}
	held := new(atomic.Bool)
	held.Store(h.on)
	h.outs[out] = held
	return held
}

func (h *holes) remove(out net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.outs, out)
}

func (h *holes) blackHole() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.on = true
	for _, held := range h.outs {
		held.Store(true)
	}
}

func (h *holes) open() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.on = false
}

// swallow reports whether a new connection goes into the black hole.
func (h *holes) swallow() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.on
}

// heldPorts are the local ports of the held connections to the service.
func (h *holes) heldPorts() []int {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ports []int
	for c, held := range h.outs {
		if a, ok := c.LocalAddr().(*net.TCPAddr); ok && held.Load() {
			ports = append(ports, a.Port)
		}
	}
	return ports
}

// ServerPorter is a proxy that names the client ports of its sessions on
// the server: CutProxy and PGProxy.
type ServerPorter interface {
	ServerPorts() []int
}

// EndServerSessions makes db's server end every session that proxy holds
// in a black hole, as the server itself would once a timeout it keeps passed
// (wait_timeout, idle_in_transaction_session_timeout): MariaDB's KILL
// CONNECTION, PostgreSQL's pg_terminate_backend. Each session's open
// transaction is rolled back and its locks are released. db must reach the
// same server directly (not through proxy). It returns how many sessions
// it ended, once the server no longer lists them (pg_terminate_backend
// waits for the backend's exit; a killed MariaDB thread leaves the process
// list once its rollback is done).
func EndServerSessions(t testing.TB, db *sqlx.DB, proxy ServerPorter) int {
	t.Helper()
	ports := proxy.ServerPorts()
	n, err := endServerSessions(db, ports)
	if err != nil {
		t.Fatalf("%v", err)
	}
	Eventually(t, 60*time.Second, "the ended sessions gone from the server", func() bool {
		ids, err := serverSessions(db, ports)
		return err == nil && len(ids) == 0
	})
	return n
}

// HeldSessions counts the sessions db's server still keeps for the
// connections proxy holds in a black hole: how a test sees that the server
// ended them by itself (an idle limit) or still keeps them.
func HeldSessions(t testing.TB, db *sqlx.DB, proxy ServerPorter) int {
	t.Helper()
	ids, err := serverSessions(db, proxy.ServerPorts())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return len(ids)
}

// serverSessions returns the server's session ids (MariaDB's connection
// ids, PostgreSQL's backend pids) of the clients on 127.0.0.1 at ports.
func serverSessions(db *sqlx.DB, ports []int) ([]int64, error) {
	var all []int64
	for _, port := range ports {
		var ids []int64
		var err error
		if db.DriverName() == "mysql" {
			err = db.Select(&ids, "SELECT ID FROM information_schema.PROCESSLIST WHERE HOST = ?", fmt.Sprintf("127.0.0.1:%d", port))
		} else {
			err = db.Select(&ids, "SELECT pid FROM pg_stat_activity WHERE client_addr = '127.0.0.1' AND client_port = $1", port)
		}
		if err != nil {
			return all, fmt.Errorf("testenv: server sessions: %w", err)
		}
		all = append(all, ids...)
	}
	return all, nil
}

func endServerSessions(db *sqlx.DB, ports []int) (int, error) {
	ids, err := serverSessions(db, ports)
	if err != nil {
		return 0, err
	}
	ended := 0
	for _, id := range ids {
		if db.DriverName() == "mysql" {
			if _, err := db.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
				return ended, fmt.Errorf("testenv: end session %d: %w", id, err)
			}
			ended++
			continue
		}
		// Waits (up to 10 s) until the backend has exited.
		var ok bool
		if err := db.Get(&ok, "SELECT pg_terminate_backend($1, 10000)", id); err != nil {
			return ended, fmt.Errorf("testenv: end session %d: %w", id, err)
		}
		if ok {
			ended++
		}
	}
	return ended, nil
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
	if p.holes.swallow() {
		// Accepted into the black hole: held open, never connected on.
		drain(in)
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
	pipe := func(dst, src net.Conn) {
		forward(dst, src, held)
		done <- struct{}{}
	}
	if p.mysql {
		var lose atomic.Pointer[loseArm[LostCommit]] // set once this connection's COMMIT went out
		go func() { p.clientToServer(out, in, &lose, held); done <- struct{}{} }()
		go func() { p.serverToClient(in, out, &lose, held); done <- struct{}{} }()
	} else {
		go pipe(out, in)
		go pipe(in, out)
	}
	<-done
	if !held.Load() {
		p.untrack(in, out) // closing both ends stops the other copy
	}
	// In a black hole the other side is not told: it stays open until it
	// ends itself or Cut closes it.
	<-done
	p.untrack(in, out)
}

// forward copies src to dst until either fails; while hole is set, what
// it reads is dropped.
func forward(dst, src net.Conn, hole *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !hole.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// drain reads c and drops everything until it fails (the client closed
// it, or Cut did).
func drain(c net.Conn) { _, _ = io.Copy(io.Discard, c) }

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
func (p *CutProxy) clientToServer(server, client net.Conn, lose *atomic.Pointer[loseArm[LostCommit]], held *atomic.Bool) {
	for {
		pkt, err := readPacket(client)
		if err != nil {
			return
		}
		if held.Load() {
			continue
		}
		if isCommit(pkt) {
			if arm := p.lose.Swap(nil); arm != nil {
				lose.Store(arm)
			}
		}
		if _, err := server.Write(pkt); err != nil {
			return
		}
	}
}

// serverToClient forwards the server's packets, except the answer to a
// COMMIT whose answer is to be lost: that packet is read, handed to the
// test, and the proxy cuts (or black-holes) instead of forwarding it.
func (p *CutProxy) serverToClient(client, server net.Conn, lose *atomic.Pointer[loseArm[LostCommit]], held *atomic.Bool) {
	for {
		pkt, err := readPacket(server)
		if err != nil {
			return
		}
		if held.Load() {
			continue
		}
		if arm := lose.Swap(nil); arm != nil {
			if arm.hole {
				p.BlackHole()
				arm.ch <- LostCommit{Answer: pkt[4:]}
				continue
			}
			// Handed over before the cut (see PGProxy.serverToClient).
			arm.ch <- LostCommit{Answer: pkt[4:]}
			p.Cut()
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

// DBHole is the protocol-aware proxy of either database in front of one
// test database (NewMySQLProxy or NewPGProxy), for tests that run on both:
// it black-holes, loses a COMMIT's answer into a black hole, and ends the
// server sessions held behind it.
type DBHole struct {
	db    *sqlx.DB
	my    *CutProxy
	pg    *PGProxy
	proxy interface {
		Addr() string
		BlackHole()
		Cut()
		Restore()
		ServerPorts() []int
	}
}

// NewDBHole starts the proxy to db's server, closed when the test ends.
func NewDBHole(t testing.TB, db *sqlx.DB) *DBHole {
	t.Helper()
	h := &DBHole{db: db}
	if db.DriverName() == "mysql" {
		h.my = NewMySQLProxy(t, ServerAddr(t, db))
		h.proxy = h.my
	} else {
		h.pg = NewPGProxy(t, ServerAddr(t, db))
		h.proxy = h.pg
	}
	return h
}

// Pool opens a pool on the test database through the proxy, closed when
// the test ends. On MariaDB its DSN's readTimeout is readTimeout: the
// driver's COMMIT takes no context, so that timeout is what ends a client's
// wait for an answer the black hole keeps (the test DSNs' 60 s would only
// slow the test down). pgx ends that wait with the context of the
// transaction's statements.
func (h *DBHole) Pool(t testing.TB, readTimeout time.Duration) *sqlx.DB {
	t.Helper()
	if h.my != nil {
		return openVariant(t, h.db, func(c *mysql.Config) { c.Addr, c.ReadTimeout = h.my.Addr(), readTimeout })
	}
	return PoolVia(t, h.db, h.pg.Addr())
}

// BlackHole black-holes every connection through the proxy.
func (h *DBHole) BlackHole() { h.proxy.BlackHole() }

// Cut ends the black hole by closing every connection; Restore lets new
// ones through and leaves the held ones held (CutProxy.BlackHole).
func (h *DBHole) Cut()     { h.proxy.Cut() }
func (h *DBHole) Restore() { h.proxy.Restore() }

// EndSessions is EndServerSessions for the sessions the proxy holds in its
// black hole, ended from db's direct pool.
func (h *DBHole) EndSessions(t testing.TB) int {
	t.Helper()
	return EndServerSessions(t, h.db, h.proxy)
}

// HeldSessions is HeldSessions for the proxy's black hole, counted from
// db's direct pool.
func (h *DBHole) HeldSessions(t testing.TB) int {
	t.Helper()
	return HeldSessions(t, h.db, h.proxy)
}

// HoleCommit is a lost COMMIT answer, as HoleCommitAnswer armed it.
type HoleCommit struct {
	Lost      bool   // the proxy dropped the answer to a COMMIT
	Committed bool   // the server's answer said committed
	Answer    string // the answer, for a failure message
}

// HoleCommitAnswer arms the proxy (CutProxy.HoleCommitAnswer): the answer
// to the next COMMIT through it is dropped and the proxy black-holes. The
// returned function reports, without waiting, what it dropped (Lost false:
// not yet); once Lost, it keeps reporting the same.
func (h *DBHole) HoleCommitAnswer(t testing.TB) func() HoleCommit {
	t.Helper()
	var (
		mu   sync.Mutex
		got  HoleCommit
		poll func() (HoleCommit, bool)
	)
	if h.my != nil {
		ch := h.my.HoleCommitAnswer(t)
		poll = func() (HoleCommit, bool) {
			select {
			case l := <-ch:
				return HoleCommit{Lost: true, Committed: l.OK(), Answer: fmt.Sprintf("first byte %#x", l.Answer[0])}, true
			default:
				return HoleCommit{}, false
			}
		}
	} else {
		ch := h.pg.HoleCommitAnswer(t)
		poll = func() (HoleCommit, bool) {
			select {
			case l := <-ch:
				return HoleCommit{Lost: true, Committed: l.OK(), Answer: "tag " + l.Tag}, true
			default:
				return HoleCommit{}, false
			}
		}
	}
	return func() HoleCommit {
		mu.Lock()
		defer mu.Unlock()
		if !got.Lost {
			if c, ok := poll(); ok {
				got = c
			}
		}
		return got
	}
}

// LockedOut reports whether query (a locking statement: an INSERT of an
// existing key, an UPDATE, a SELECT ... FOR UPDATE) waits on a lock that
// another session holds: it runs it on db, in a transaction that it rolls
// back, with a lock wait of one second, and reports a lock timeout as true,
// success as false, and fails t on any other error. It is how a test sees
// that a session it cannot reach (behind a black hole) still holds a row.
func LockedOut(t testing.TB, db *sqlx.DB, query string, args ...any) bool {
	t.Helper()
	d, err := dialect.For(db)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := db.Connx(ctx)
	if err != nil {
		t.Fatalf("testenv: locked out: %v", err)
	}
	defer conn.Close()
	set, reset := "SET LOCAL lock_timeout = '1s'", ""
	if db.DriverName() == "mysql" {
		set, reset = "SET SESSION innodb_lock_wait_timeout = 1", "SET SESSION innodb_lock_wait_timeout = DEFAULT"
	}
	tx, err := conn.BeginTxx(ctx, nil)
	if err != nil {
		t.Fatalf("testenv: locked out: %v", err)
	}
	if _, err := tx.ExecContext(ctx, set); err != nil {
		_ = tx.Rollback()
		t.Fatalf("testenv: locked out: %v", err)
	}
	_, err = tx.ExecContext(ctx, tx.Rebind(query), args...)
	_ = tx.Rollback()
	if reset != "" {
		if _, rerr := conn.ExecContext(ctx, reset); rerr != nil {
			t.Fatalf("testenv: locked out: %v", rerr)
		}
	}
	switch {
	case err == nil:
		return false
	case d.IsLockTimeout(err):
		return true
	}
	t.Fatalf("testenv: locked out: %v", err)
	return false
}
