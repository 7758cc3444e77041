package rmqtxtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

// Options configure a Broker. The zero value is usable.
type Options struct {
	// Queues is the number of queues of a topic created on first use or by
	// CreateTopic with 0 (default 4).
	Queues int
	// NoAutoCreate refuses sends to unknown topics (TOPIC_NOT_EXIST, code
	// 17) and routes to none, as a production broker with
	// autoCreateTopicEnable=false does. Default: topics are created on
	// first use.
	NoAutoCreate bool
	// CheckImmunity is how old a pending half must be (on the broker's
	// clock) before Advance checks it (broker transactionTimeOut; default
	// 6 s). CheckNow ignores it.
	CheckImmunity time.Duration
	// CheckMax is how many checks a half gets before the broker discards it
	// to TRANS_CHECK_MAX_TIME_TOPIC (broker transactionCheckMax; default 15).
	CheckMax int
	// KeepRetryDelays makes a consume retry wait for its delay level on the
	// broker's clock (Advance); by default a message sent back is
	// redelivered at once.
	KeepRetryDelays bool
	// Logger receives the broker's own log lines (default: quiet). Never
	// payloads.
	Logger logrus.FieldLogger
}

// Names the broker registers under; a test sees them in routes and in
// MessageQueue.BrokerName.
const (
	BrokerName  = "rmqtxtest-a"
	ClusterName = "rmqtxtest"
)

// System topics of the broker.
const (
	halfTopic    = "RMQ_SYS_TRANS_HALF_TOPIC"
	discardTopic = "TRANS_CHECK_MAX_TIME_TOPIC"
	defaultTopic = "TBW102"
	retryPrefix  = "%RETRY%"
	dlqPrefix    = "%DLQ%"
)

// ErrClosed is returned by the Broker's methods after Close.
var ErrClosed = errors.New("rmqtxtest: broker closed")

// Broker is the in-process name server and broker. All its state lives in
// memory under one mutex; the goroutines it runs are the two accept loops
// and one reader per connection, and Close waits for all of them.
type Broker struct {
	opts Options
	log  logrus.FieldLogger

	nsLn, brLn net.Listener
	nsAddr     string
	brAddr     string
	storeHost  hostPort
	wg         sync.WaitGroup // accept loops, connection readers, pull timers

	mu       sync.Mutex
	outq     []delivery // frames to write once mu is released (see unlock)
	closed   bool
	draining bool // Restart is failing parked pulls before it drops the connections
	conns    map[*conn]struct{}
	connSeq  int
	clients  map[string]*client
	changed  chan struct{} // closed and replaced on every state change

	clock      time.Time
	commitNext int64
	topics     map[string]*topic
	byOffset   map[int64]*record // commit log offset -> first stored record
	halves     []*half
	halfByOff  map[int64]*half
	halfNext   int64 // next queue offset of the half topic
	holding    map[string]bool
	held       map[string][]*record
	delayed    []*record
	offsets    map[offsetKey]int64
	parked     map[queueKey][]*parkedPull
	checkSeen  map[int64]int // commit log offset -> check answers received
	loseEnd    int
	failSend   []string
	statusNext []statusFault
	failPull   []string
	dupNext    []string
	unknownLog map[int]bool
	oneway     map[int]int // requests marked one-way, by request code (a client patch's test reads it)
	requests   map[int]int // every request, by request code (the keyed Send's test reads it)
}

// delivery is a frame for a connection, written after the state lock is
// released so that a slow client never stalls the broker.
type delivery struct {
	c   *conn
	cmd *command
}

// Start starts a Broker on 127.0.0.1 (random ports). Close stops it.
func Start(opts Options) (*Broker, error) {
	if opts.Queues <= 0 {
		opts.Queues = 4
	}
	if opts.CheckImmunity <= 0 {
		opts.CheckImmunity = 6 * time.Second
	}
	if opts.CheckMax <= 0 {
		opts.CheckMax = 15
	}
	log := opts.Logger
	if log == nil {
		l := logrus.New()
		l.SetOutput(io.Discard)
		log = l
	}
	b := &Broker{
		opts: opts, log: log.WithField("component", "rmqtxtest"),
		conns: map[*conn]struct{}{}, clients: map[string]*client{}, changed: make(chan struct{}),
		clock: time.Now(), topics: map[string]*topic{}, byOffset: map[int64]*record{},
		halfByOff: map[int64]*half{}, holding: map[string]bool{}, held: map[string][]*record{},
		offsets: map[offsetKey]int64{}, parked: map[queueKey][]*parkedPull{}, checkSeen: map[int64]int{},
		unknownLog: map[int]bool{},
	}
	ns, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("rmqtxtest: listen (name server): %w", err)
	}
	br, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = ns.Close()
		return nil, fmt.Errorf("rmqtxtest: listen (broker): %w", err)
	}
	b.nsLn, b.brLn = ns, br
	b.nsAddr, b.brAddr = ns.Addr().String(), br.Addr().String()
	b.storeHost = hostPortOf(br.Addr())
	if !opts.NoAutoCreate {
		b.createTopicLocked(defaultTopic, opts.Queues)
	}
	// A real broker creates the discard topic at its first discard; it
	// exists from the start here so that discard recovery subscribes at
	// once instead of polling for it.
	b.createTopicLocked(discardTopic, 1)
	b.wg.Add(2)
	go b.accept(ns, true)
	go b.accept(br, false)
	b.log.WithFields(logrus.Fields{"nameserver": b.nsAddr, "broker": b.brAddr}).Debug("rmqtxtest: started")
	return b, nil
}

// NewBroker starts a Broker for a test and closes it in t.Cleanup; it
// fails the test if it cannot start. It takes at most one Options.
func NewBroker(t testing.TB, opts ...Options) *Broker {
	t.Helper()
	if len(opts) > 1 {
		t.Fatalf("rmqtxtest: NewBroker takes at most one Options, got %d", len(opts))
	}
	var o Options
	if len(opts) == 1 {
		o = opts[0]
	}
	b, err := Start(o)
	if err != nil {
		t.Fatalf("rmqtxtest: start broker: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// Close stops the broker: it closes the listeners and every connection and
// waits for every goroutine it started. It is idempotent.
func (b *Broker) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	b.stopParkedLocked(nil)
	conns := make([]*conn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.outq = nil
	b.broadcastLocked()
	b.mu.Unlock()
	_ = b.nsLn.Close()
	_ = b.brLn.Close()
	for _, c := range conns {
		_ = c.nc.Close()
	}
	b.wg.Wait()
	return nil
}

// NameServers returns the name server address list to give a client.
func (b *Broker) NameServers() []string { return []string{b.nsAddr} }

// NameServer returns the name server address ("127.0.0.1:port").
func (b *Broker) NameServer() string { return b.nsAddr }

// BrokerAddr returns the broker address ("127.0.0.1:port").
func (b *Broker) BrokerAddr() string { return b.brAddr }

// lock and unlock guard the state; unlock then writes the frames queued
// while it was held.
func (b *Broker) lock() { b.mu.Lock() }

func (b *Broker) unlock() {
	out := b.outq
	b.outq = nil
	b.mu.Unlock()
	for _, d := range out {
		d.c.write(d.cmd)
	}
}

// sendLocked queues cmd for c (written at unlock).
func (b *Broker) sendLocked(c *conn, cmd *command) {
	if c == nil || cmd == nil {
		return
	}
	b.outq = append(b.outq, delivery{c: c, cmd: cmd})
}

// broadcastLocked wakes every waiter on the state (WaitMessages, CheckNow).
func (b *Broker) broadcastLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// conn is one client connection, to the name server or to the broker.
type conn struct {
	nc       net.Conn
	ns       bool
	seq      int
	wmu      sync.Mutex
	clientID string          // from its heartbeat
	groups   map[string]bool // producer groups it sent for or heartbeated
	restart  bool            // dropped by Restart: its clients stay registered
}

func (c *conn) write(cmd *command) {
	frame, err := cmd.encode()
	if err != nil {
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _ = c.nc.Write(frame)
}

func (b *Broker) accept(ln net.Listener, ns bool) {
	defer b.wg.Done()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		b.lock()
		if b.closed {
			b.unlock()
			_ = nc.Close()
			return
		}
		b.connSeq++
		c := &conn{nc: nc, ns: ns, seq: b.connSeq, groups: map[string]bool{}}
		b.conns[c] = struct{}{}
		b.wg.Add(1)
		b.unlock()
		go b.serve(c)
	}
}

// serve reads c's requests and answers them in order; a long-polling pull
// is parked rather than answered, so it never blocks the connection.
func (b *Broker) serve(c *conn) {
	defer b.wg.Done()
	defer b.dropConn(c)
	r := bufio.NewReader(c.nc)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				b.log.WithError(err).Debug("rmqtxtest: connection closed")
			}
			return
		}
		if cmd.response() {
			continue // the clients answer nothing the broker waits for
		}
		b.lock()
		if b.requests == nil {
			b.requests, b.oneway = map[int]int{}, map[int]int{}
		}
		b.requests[cmd.Code]++
		if cmd.oneway() {
			b.oneway[cmd.Code]++
		}
		b.unlock()
		var resp *command
		if c.ns {
			resp = b.handleNameServer(c, cmd)
		} else {
			resp = b.handleBroker(c, cmd)
		}
		if resp != nil && !cmd.oneway() {
			c.write(resp)
		}
	}
}

// dropConn forgets c: its parked pulls, and the clients it carried, unless
// Restart dropped it (a restarted broker's clients register again at their
// next heartbeat; until then they stay counted, see Restart).
func (b *Broker) dropConn(c *conn) {
	_ = c.nc.Close()
	b.lock()
	defer b.unlock()
	delete(b.conns, c)
	b.stopParkedLocked(c)
	changedGroups := map[string]bool{}
	for id, cl := range b.clients {
		if cl.conn != c {
			continue
		}
		if c.restart {
			cl.conn = nil
			continue
		}
		for g := range cl.consumers {
			changedGroups[g] = true
		}
		delete(b.clients, id)
	}
	for g := range changedGroups {
		b.notifyGroupLocked(g, nil)
	}
	if !b.closed {
		b.broadcastLocked()
	}
}

// handleBroker answers one broker request.
func (b *Broker) handleBroker(c *conn, req *command) *command {
	switch req.Code {
	case reqSendMessage, reqSendMessageV2, reqSendBatchMessage:
		return b.handleSend(c, req)
	case reqPullMessage:
		return b.handlePull(c, req)
	case reqQueryConsumerOffset:
		return b.handleQueryOffset(req)
	case reqUpdateConsumerOffset:
		return b.handleUpdateOffset(req)
	case reqCreateTopic:
		return b.handleCreateTopic(req)
	case reqGetBrokerConfig:
		return b.handleBrokerConfig(req)
	case reqSearchOffsetByTime:
		return b.handleSearchOffset(req)
	case reqGetMaxOffset, reqGetMinOffset:
		return b.handleMinMaxOffset(req)
	case reqHeartbeat:
		return b.handleHeartbeat(c, req)
	case reqUnregisterClient:
		return b.handleUnregister(c, req)
	case reqSendBack:
		return b.handleSendBack(req)
	case reqEndTransaction:
		return b.handleEndTransaction(req)
	case reqGetConsumerList:
		return b.handleConsumerList(req)
	case reqLockBatchMQ:
		return b.handleLockBatch(req)
	case reqUnlockBatchMQ:
		return newResponse(req, codeSuccess, "", nil)
	case reqGetProducerConns:
		return b.handleProducerConnections(req)
	case reqQueryMessage:
		return b.handleQueryMessage(req)
	case reqGetRouteInfo, reqGetClusterInfo:
		return newResponse(req, codeNotSupported, fmt.Sprintf("request type %d not supported", req.Code), nil)
	}
	return b.unsupported(req)
}

func (b *Broker) unsupported(req *command) *command {
	b.lock()
	first := !b.unknownLog[req.Code]
	b.unknownLog[req.Code] = true
	b.unlock()
	if first {
		b.log.WithField("code", req.Code).Debug("rmqtxtest: request code not supported")
	}
	return newResponse(req, codeNotSupported, fmt.Sprintf("request type %d not supported", req.Code), nil)
}

// Request codes served (rocketmq-client-go internal/request.go).
const (
	reqSendMessage          = 10
	reqPullMessage          = 11
	reqQueryMessage         = 12
	reqQueryConsumerOffset  = 14
	reqUpdateConsumerOffset = 15
	reqCreateTopic          = 17
	reqGetBrokerConfig      = 26
	reqSearchOffsetByTime   = 29
	reqGetMaxOffset         = 30
	reqGetMinOffset         = 31
	reqHeartbeat            = 34
	reqUnregisterClient     = 35
	reqSendBack             = 36
	reqEndTransaction       = 37
	reqGetConsumerList      = 38
	reqCheckTransaction     = 39
	reqNotifyConsumerIDs    = 40
	reqLockBatchMQ          = 41
	reqUnlockBatchMQ        = 42
	reqGetRouteInfo         = 105
	reqGetClusterInfo       = 106
	reqGetProducerConns     = 204
	reqSendMessageV2        = 310
	reqSendBatchMessage     = 320
)
