package txproducer

import (
	"context"
	"net"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// Why the producer watches the cluster's brokers.
//
// A broker sends checks only over connections of instances that registered
// with it by heartbeat, and a restarted broker has lost every one of them.
// rocketmq-client-go heartbeats every 30 s, so for up to 30 s after a
// restart the broker finds no channel for the group's pending halves
// ("Check transaction failed, channel is null"), each failed check counts
// toward transactionCheckMax, and with short check settings the broker
// discards halves that a check would have resolved: discard recovery then
// republishes the committed ones, up to a minute late.
//
// Detection. The name server drops a broker whose connection closes (a
// kill, a shutdown, a crash the operating system sees), so the watcher asks
// it for the cluster's masters once per BrokerWatchInterval (one
// GET_BROKER_CLUSTER_INFO) and notes a master that left. But a restarted
// broker checks halves before the name server lists it again: RocketMQ
// 5.3.3, restarted after a kill -9, ran its first checks 2 s after it
// started and registered with the name server 10 s after (its first
// registration found no name server available yet and waited for the
// next, 10 s later), by which time the test bed's five checks 2 s apart
// had discarded every pending half. So while a master is away the watcher
// tries to open a TCP connection to it at each poll (refused at once while
// it is down), and treats an accepted connection as its return: the broker
// accepts connections before it starts checking. A master that the name
// server lists and did not list at the previous poll (a new broker, or one
// whose absence the dials did not see) counts as returned too. Nothing but
// the one name-server request per poll is sent while no master is away.
//
// On a return the watcher refreshes the client's routes (in a cluster the
// client may have dropped the broker while it was away, and then knows it
// again only once the name server lists it), heartbeats at once, and asks
// the broker whether it lists this instance; one that does not yet is
// tried again at each poll, for at most rejoinFor, after which the client's
// own heartbeat has had its turn. The client has no public call for either
// step (the seam reaches it, see broker.TxProducer).
//
// Not seen: a broker that restarts before the name server notices it was
// gone (a host that reboots without closing its connections, within the
// name server's 120 s broker expiry), and one away longer than awayFor (it
// counts as returned when the name server lists it again). The client's own
// heartbeat registers the instance there.

// rejoinFor bounds how long a broker that returned is heartbeated again at
// each poll until it lists this instance: the client's heartbeat period.
const rejoinFor = 30 * time.Second

// awayFor bounds how long a master that left the cluster is dialled at each
// poll: a broker removed for good is not dialled forever.
const awayFor = 10 * time.Minute

// watcher is the goroutine of watchBrokers.
type watcher struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// stop ends the watcher and waits for it (a heartbeat in progress is
// bounded by the client's 3 s per broker).
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
		p.watch(ctx, tp, known)
	}()
	return w
}

func (p *Producer) watch(ctx context.Context, tp broker.TxProducer, known []string) {
	l := p.cfg.Logger.WithField("group", p.cfg.Group)
	view := map[string]bool{}
	for _, a := range known {
		view[a] = true
	}
	haveView := known != nil
	away := map[string]time.Time{}    // master -> when the name server stopped listing it
	pending := map[string]time.Time{} // master -> when it returned, until it lists this instance
	returned := func(addr, how string) {
		delete(away, addr)
		if _, ok := pending[addr]; !ok {
			pending[addr] = time.Now()
			l.WithField("broker", addr).Info("txproducer: a master broker " + how + "; registering this instance with it now")
		}
	}
	t := time.NewTicker(p.cfg.BrokerWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if masters, err := remoting.ClusterMasters(ctx, p.cfg.NameServers, p.cfg.SendTimeout); err == nil {
			next := make(map[string]bool, len(masters))
			for _, a := range masters {
				next[a] = true
				if haveView && !view[a] {
					returned(a, "appeared in the cluster")
				}
			}
			for a := range view {
				if _, ok := away[a]; !next[a] && !ok {
					away[a] = time.Now()
					delete(pending, a)
					l.WithField("broker", a).Info("txproducer: a master broker left the cluster; watching for its return")
				}
			}
			view, haveView = next, true
		}
		for a, since := range away {
			switch {
			case accepts(ctx, a, p.cfg.SendTimeout):
				returned(a, "accepts connections again")
			case time.Since(since) >= awayFor:
				delete(away, a)
			}
		}
		if len(pending) > 0 && ctx.Err() == nil {
			p.rejoin(ctx, tp, pending)
		}
	}
}

// accepts reports whether a TCP connection to addr opens (it is closed at
// once).
func accepts(ctx context.Context, addr string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// rejoin refreshes the client's routes, heartbeats every broker in them,
// and drops from pending each broker that now lists this instance, or that
// has been pending for rejoinFor.
func (p *Producer) rejoin(ctx context.Context, tp broker.TxProducer, pending map[string]time.Time) {
	tp.RefreshRoutes()
	tp.Heartbeat()
	for addr, since := range pending {
		l := p.cfg.Logger.WithFields(map[string]any{"group": p.cfg.Group, "broker": addr})
		ids, err := remoting.ProducerConnections(ctx, addr, p.cfg.SendTimeout, p.cfg.Group)
		switch {
		case err == nil && listsInstance(ids, p.cfg.InstanceName):
			delete(pending, addr)
			l.WithField("after", time.Since(since).Round(time.Millisecond).String()).Info("txproducer: the broker lists this instance again; its checks reach it")
		case time.Since(since) >= rejoinFor:
			delete(pending, addr)
			if err != nil {
				l = l.WithError(err)
			}
			l.Info("txproducer: the broker does not list this instance (none of its topics is on it, or it does not answer); left to the client's heartbeat")
		}
	}
}
