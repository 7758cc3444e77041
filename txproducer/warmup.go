package txproducer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// ErrTopicNotFound: a WarmupTopics topic does not exist and the broker does
// not create topics on first use (autoCreateTopicEnable=false, as on most
// production clusters). Start's error names the topic and wraps ErrStart
// too; create the topic (mqadmin updateTopic, or rmqtx topic create) and
// call Start again. It is errclass.ErrTopicNotFound.
var ErrTopicNotFound = errclass.ErrTopicNotFound

// Why warm-up works the way it does.
//
// A broker sends a check to an instance of the group that registered with
// it, and an instance registers by heartbeat. rocketmq-client-go heartbeats
// only the brokers in its route table, that is the brokers of the topics it
// has sent to, one second after Start and then every 30 s. A probe to a
// topic loads the topic's whole route (every broker with queues of it), so
// one probe per topic is enough to learn the brokers; what is not enough is
// the timing: a warm-up that ends after the client's first heartbeat leaves
// the instance unknown to every broker for 30 s, long enough for a broker
// with short check settings to discard halves it could have committed.
// So after the probes the client heartbeats at once (broker.TxProducer's
// Heartbeat), and Start confirms with each broker that it registered this
// instance.

// warmup probes every WarmupTopics topic, registers this instance with every
// broker of those topics, and logs a warning naming any broker that did not
// register it, and any master broker of the cluster that serves none of the
// topics (its halves of this group get no answer from this instance until
// it sends to a topic there).
func (p *Producer) warmup(ctx context.Context, tp broker.TxProducer, started time.Time) error {
	if len(p.cfg.WarmupTopics) == 0 {
		return nil
	}
	for _, topic := range p.cfg.WarmupTopics {
		if err := p.probe(ctx, tp, topic); err != nil {
			if p.topicMissing(ctx, topic, err) {
				return fmt.Errorf("%w: %w: warm-up topic %s does not exist (the broker does not create topics on first use): create it before starting, with mqadmin updateTopic -c <cluster> -t %s or rmqtx topic create --name %s (%w)",
					ErrStart, ErrTopicNotFound, topic, topic, topic, err)
			}
			return err
		}
	}
	if !tp.Heartbeat() {
		// A client whose layout the seam does not know: wait for its own
		// first heartbeat, as before.
		if time.Since(started) > firstHeartbeat-100*time.Millisecond {
			p.cfg.Logger.Warn("txproducer: warm-up took longer than the client's first heartbeat; checks may reach this instance only after the next one (30 s)")
		}
		t := time.NewTimer(time.Until(started.Add(firstHeartbeat + 200*time.Millisecond)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("txproducer: start: %w", ctx.Err())
		}
	}
	p.confirmRegistered(ctx)
	return nil
}

// topicMissing reports whether the failed probe of topic failed because
// the topic does not exist: the broker answered TOPIC_NOT_EXIST (17), or
// the name server knows no route for it (the client then reports "route
// info not found" without a code).
func (p *Producer) topicMissing(ctx context.Context, topic string, probeErr error) bool {
	if code, ok := brokerclass.CodeOf(probeErr); ok && code == brokerclass.TopicNotExist {
		return true
	}
	_, err := remoting.TopicRoute(ctx, p.cfg.NameServers, p.cfg.SendTimeout, topic)
	return errors.Is(err, remoting.ErrTopicNotFound)
}

// confirmRegistered asks every master broker of the warm-up topics whether
// it lists this instance among the group's producers (the channels it sends
// checks to). It only logs: a broker that is down must not stop Start.
func (p *Producer) confirmRegistered(ctx context.Context) {
	l := p.cfg.Logger.WithField("group", p.cfg.Group)
	serving := map[string]bool{}
	for _, topic := range p.cfg.WarmupTopics {
		brokers, err := remoting.MasterBrokers(ctx, p.cfg.NameServers, p.cfg.SendTimeout, topic)
		if err != nil {
			l.WithError(err).WithField("topic", topic).Info("txproducer: warm-up could not read the topic's route; registration not confirmed")
			continue
		}
		for _, b := range brokers {
			serving[b] = true
		}
	}
	for addr := range serving {
		ids, err := remoting.ProducerConnections(ctx, addr, p.cfg.SendTimeout, p.cfg.Group)
		if err != nil {
			l.WithError(err).WithField("broker", addr).Info("txproducer: warm-up could not confirm the registration")
			continue
		}
		if !listsInstance(ids, p.cfg.InstanceName) {
			l.WithField("broker", addr).Warn("txproducer: the broker has not registered this instance after warm-up; its checks reach the group's other instances, or this one after its next heartbeat (30 s)")
		}
	}
	masters, err := remoting.ClusterMasters(ctx, p.cfg.NameServers, p.cfg.SendTimeout)
	if err != nil {
		return
	}
	for _, addr := range masters {
		if !serving[addr] {
			l.WithField("broker", addr).Warn("txproducer: no WarmupTopics topic has queues on this master broker; a restarted instance answers its checks only after sending to a topic there (list one topic per broker)")
		}
	}
}

// listsInstance reports whether one of the client ids (ip@instance[@unit])
// is this instance's.
func listsInstance(clientIDs []string, instance string) bool {
	for _, id := range clientIDs {
		parts := strings.Split(id, "@")
		if len(parts) >= 2 && parts[1] == instance {
			return true
		}
	}
	return false
}
