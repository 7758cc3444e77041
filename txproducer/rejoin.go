package txproducer

import (
	"context"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// Why the producer watches the cluster's brokers.
//
// A broker sends checks only over connections of instances that registered
// with it by heartbeat, and a restarted broker has lost every one of them.
// rocketmq-client-go heartbeats every 30 s, and only the masters in its
// route table, so without the watcher:
//   - for up to 30 s after a restart the broker finds no channel for the
//     group's pending halves ("Check transaction failed, channel is null"),
//     each failed check counts toward transactionCheckMax, and with short
//     check settings the broker discards halves that a check would have
//     resolved (discard recovery then republishes the committed ones, late);
//   - a slave that the controller promotes to master (RocketMQ 5 controller
//     mode) knows no instance of the group until the clients learn the new
//     route (up to 30 s) and heartbeat it.
//
// What the watcher does, by event rather than by timer where it can:
//   - It holds one idle TCP connection (a sentinel) to every master. A
//     master that dies (kill, crash, shutdown) closes it, and the watcher
//     learns at once, not at its next poll. It then dials the master every
//     fastInterval (refused at once while it is down) and treats an
//     accepted connection as its return: a restarted RocketMQ 5.3.3 broker
//     accepts connections before its first check pass (about one
//     transactionCheckInterval after it starts) and registers with the name
//     server only seconds later, so reacting to the first accepted
//     connection is what registers this instance before the broker checks.
//   - On a return, or when the name server lists a master it did not list
//     before (a promotion, a new broker), it heartbeats that broker directly
//     over the client's own connection (broker.TxProducer.HeartbeatBroker:
//     the client's route table may have dropped the broker), refreshes the
//     client's routes so Sends follow, and asks the broker whether it lists
//     this instance; one that does not yet is tried again every
//     fastInterval, for at most rejoinFor.
//   - It registers with every slave too (at once when one appears, then
//     every slaveBeatEvery, within the broker's 120 s channel expiry), so a
//     promoted slave already lists this instance when it starts checking.
//   - While a master is away, or a return is not yet registered, it asks
//     the name server every fastPoll, to see a promotion promptly; else once
//     per BrokerWatchInterval (one GET_BROKER_CLUSTER_INFO), the fallback
//     that also sees a master whose sentinel could not tell (a frozen or
//     partitioned host keeps its connections open).
//
// The broker closes a connection idle for 120 s; a sentinel closed that
// way is reopened at once and nothing else happens. Not seen: a master
// that restarts before its sentinel's connection notices (a host that
// reboots without closing its connections): the poll or the client's own
// heartbeat registers the instance there.

// fastInterval is how often, while a master is away or a return is not yet
// registered, the watcher dials the away masters and heartbeats the
// returned ones.
const fastInterval = 100 * time.Millisecond

// fastPoll is how often the watcher asks the name server for the masters
// while one is away: a promoted slave registers there within a second.
const fastPoll = 500 * time.Millisecond

// slaveBeatEvery is how often the watcher heartbeats the slaves (the broker
// expires a producer channel after 120 s without a heartbeat).
const slaveBeatEvery = 30 * time.Second

// rejoinFor bounds how long a broker that returned is heartbeated again
// until it lists this instance: the client's heartbeat period.
const rejoinFor = 30 * time.Second

// awayFor bounds how long a master that left is dialled: a broker removed
// for good is not dialled forever.
const awayFor = 10 * time.Minute

// watcher is the goroutine of watchBrokers.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the watcher and waits for it and its sentinels (a heartbeat in
// progress is bounded by SendTimeout).
func (w *watcher) stop() {
	if w == nil {
		return
	}
	w.cancel()
	<-w.done
}

// watchBrokers starts the watcher (see above) with known, the masters Start
// listed, as the first view; nil lets the first poll set it. It returns nil,
// watching nothing, when BrokerWatchInterval is negative or the client's
// layout offers no heartbeat.
func (p *Producer) watchBrokers(tp broker.TxProducer, known []string) *watcher {
	if p.cfg.BrokerWatchInterval < 0 {
		return nil
	}
	if !tp.CanHeartbeat() {
		p.cfg.Logger.Info("txproducer: this rocketmq-client-go offers no heartbeat call; after a broker restart, checks reach this instance only after the client's next heartbeat (30 s)")
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		s := &watchState{p: p, tp: tp, ctx: ctx, sentinels: broker.NewSentinels(p.cfg.SendTimeout),
			view: map[string]bool{}, away: map[string]time.Time{},
			pending: map[string]time.Time{}, slaves: map[string]bool{},
			l: p.cfg.Logger.WithField("group", p.cfg.Group)}
		defer s.sentinels.Close()
		s.run(known)
	}()
	return w
}

// watchState is the watcher goroutine's state; only that goroutine uses it.
type watchState struct {
	p         *Producer
	tp        broker.TxProducer
	ctx       context.Context
	l         logrus.FieldLogger
	sentinels *broker.Sentinels // an idle connection to every master

	view      map[string]bool      // the masters the name server listed last
	haveView  bool                 // view came from Start or a poll
	away      map[string]time.Time // master -> since it went away
	pending   map[string]time.Time // master -> since it returned, until it lists this instance
	slaves    map[string]bool      // the slaves the name server listed last
	lastPoll  time.Time
	lastSlave time.Time
}

func (s *watchState) run(known []string) {
	for _, a := range known {
		s.view[a] = true
	}
	s.haveView = known != nil
	for a := range s.view {
		s.watch(a)
	}
	s.poll() // the slaves (and a view when Start had none)
	t := time.NewTimer(s.next())
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case a := <-s.sentinels.Lost():
			s.sentinelClosed(a)
		case <-t.C:
			s.tick()
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(s.next())
	}
}

// busy: a master is away or a return is not yet registered.
func (s *watchState) busy() bool { return len(s.away) > 0 || len(s.pending) > 0 }

func (s *watchState) next() time.Duration {
	if s.busy() {
		return fastInterval
	}
	if d := s.p.cfg.BrokerWatchInterval - time.Since(s.lastPoll); d > 0 {
		return d
	}
	return 0
}

func (s *watchState) tick() {
	every := s.p.cfg.BrokerWatchInterval
	if s.busy() && fastPoll < every {
		every = fastPoll
	}
	if time.Since(s.lastPoll) >= every {
		s.poll()
	}
	for a, since := range s.away {
		switch {
		case broker.Accepts(s.ctx, a, s.p.cfg.SendTimeout):
			s.returned(a, "accepts connections again")
		case time.Since(since) >= awayFor:
			delete(s.away, a)
		}
	}
	if len(s.pending) > 0 && s.ctx.Err() == nil {
		s.rejoin()
	}
	if time.Since(s.lastSlave) >= slaveBeatEvery {
		s.beatSlaves(nil)
	}
}

// poll asks the name server for the masters and slaves.
func (s *watchState) poll() {
	s.lastPoll = time.Now()
	masters, slaves, err := remoting.ClusterReplicas(s.ctx, s.p.cfg.NameServers, s.p.cfg.SendTimeout)
	if err != nil {
		return
	}
	next := make(map[string]bool, len(masters))
	for _, a := range masters {
		next[a] = true
		if s.haveView && !s.view[a] {
			s.returned(a, "appeared in the cluster")
		}
		s.watch(a)
	}
	for a := range s.view {
		if _, ok := s.away[a]; !next[a] && !ok {
			s.left(a, "left the cluster")
		}
	}
	s.view, s.haveView = next, true
	fresh := map[string]bool{}
	for _, a := range slaves {
		if !s.slaves[a] {
			fresh[a] = true
		}
	}
	s.slaves = fresh
	for _, a := range slaves {
		s.slaves[a] = true
	}
	if len(fresh) > 0 {
		s.beatSlaves(fresh)
	}
}

// beatSlaves heartbeats the slaves in only, or all slaves when only is nil.
func (s *watchState) beatSlaves(only map[string]bool) {
	if only == nil {
		s.lastSlave = time.Now()
		only = s.slaves
	}
	for a := range only {
		if err := s.tp.HeartbeatBroker(s.ctx, a); err != nil && s.ctx.Err() == nil {
			s.l.WithField("broker", a).WithError(err).Debug("txproducer: heartbeat to a slave failed")
		}
	}
}

// left notes a master that went away.
func (s *watchState) left(a, how string) {
	s.away[a] = time.Now()
	delete(s.pending, a)
	s.l.WithField("broker", a).Info("txproducer: a master broker " + how + "; watching for its return")
}

// returned notes a master that came back or appeared, and heartbeats it now.
func (s *watchState) returned(a, how string) {
	delete(s.away, a)
	if _, ok := s.pending[a]; !ok {
		s.pending[a] = time.Now()
		s.l.WithField("broker", a).Info("txproducer: a master broker " + how + "; registering this instance with it now")
	}
	s.watch(a)
	s.tp.RefreshRoutes()
	s.rejoin()
}

// sentinelClosed: a's sentinel connection closed. A master that accepts a
// new connection at once is alive (the broker closes idle connections);
// one that does not is away.
func (s *watchState) sentinelClosed(a string) {
	if _, ok := s.away[a]; ok {
		return
	}
	if s.view[a] && s.ctx.Err() == nil {
		if s.sentinels.Watch(a) {
			return
		}
		s.left(a, "closed its connection")
		s.poll()
	}
}

// watch starts a's sentinel unless one runs or a is away; a master that
// does not accept the connection is left to the poll.
func (s *watchState) watch(a string) {
	if _, ok := s.away[a]; ok {
		return
	}
	s.sentinels.Watch(a)
}

// rejoin heartbeats every pending broker directly, and drops from pending
// each that now lists this instance, or that has been pending for
// rejoinFor.
func (s *watchState) rejoin() {
	p := s.p
	for addr, since := range s.pending {
		l := s.l.WithField("broker", addr)
		hbErr := s.tp.HeartbeatBroker(s.ctx, addr)
		ids, err := remoting.ProducerConnections(s.ctx, addr, p.cfg.SendTimeout, p.cfg.Group)
		switch {
		case err == nil && listsInstance(ids, p.cfg.InstanceName):
			delete(s.pending, addr)
			l.WithField("after", time.Since(since).Round(time.Millisecond).String()).Info("txproducer: the broker lists this instance again; its checks reach it")
		case time.Since(since) >= rejoinFor:
			delete(s.pending, addr)
			if err == nil {
				err = hbErr
			}
			if err != nil {
				l = l.WithError(err)
			}
			l.Info("txproducer: the broker does not list this instance (it does not answer, or refuses the heartbeat); left to the client's heartbeat")
		}
	}
}
