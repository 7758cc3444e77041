package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// A consumer may start before its topic exists.
//
// Deployments do not order services: a consumer is often deployed before
// the producer whose topic it reads, and on a broker with
// autoCreateTopicEnable=false (most production clusters) that topic exists
// only once an operator creates it. rocketmq-client-go's Start fails with
// "route info not found" for a subscribed topic the name server does not
// know, so a consumer deployed first would crash-loop. Instead, Start
// subscribes after the client started (the client accepts a subscription
// then, and its periodic route refresh and rebalance cover it), logs once
// at Warn that the topic does not exist, and watches the name server: when
// the topic appears it logs at Info and makes the client refresh its
// routes, heartbeat and rebalance at once (broker.PushConsumer.RefreshNow,
// which reaches what the client's public API lacks), so consuming starts within
// topicPoll of the topic's creation instead of the client's own 30 s
// refresh plus 20 s rebalance. A topic that never appears is reported
// again at Warn every topicRewarn, so it is not silent forever; the
// client's own per-rebalance warning about it goes to Debug (internal/broker/rmqlog).

const (
	// topicPoll is how often a consumer whose topic is missing asks the
	// name server for it: one small request.
	topicPoll = 5 * time.Second
	// topicRewarn is how often the missing topic is reported again.
	topicRewarn = 5 * time.Minute
)

// topicMissing reports whether the name server answers that the subscribed
// topic does not exist. Any other answer (the route, or an error reaching
// the name server) is false: Start then subscribes before starting, as
// always.
func (c *Consumer) topicMissing(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := remoting.TopicRoute(ctx, c.cfg.NameServers, 0, c.cfg.Topic)
	return errors.Is(err, remoting.ErrTopicNotFound)
}

// topicWatch waits for a missing topic in the background; stop ends it.
type topicWatch struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (w *topicWatch) stop() {
	if w == nil {
		return
	}
	w.cancel()
	w.wg.Wait()
}

// watchTopic logs the missing topic and starts the watcher for pc.
func (c *Consumer) watchTopic(pc broker.PushConsumer) *topicWatch {
	log := c.cfg.Logger.WithFields(logrus.Fields{"topic": c.cfg.Topic, "consumer_group": c.cfg.Group})
	log.Warn("consumer: the topic does not exist yet; subscribed, consuming starts when it is created (mqadmin updateTopic or rmqtx topic create)")
	ctx, cancel := context.WithCancel(context.Background())
	w := &topicWatch{cancel: cancel}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		since := time.Now()
		warned := since
		tick := time.NewTicker(topicPoll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !c.topicMissing(ctx) {
				if ctx.Err() != nil {
					return
				}
				log.WithField("waited", time.Since(since).Round(time.Second).String()).
					Info("consumer: the topic exists now; consuming starts")
				pc.RefreshNow()
				return
			}
			if time.Since(warned) >= topicRewarn {
				warned = time.Now()
				log.WithField("waited", time.Since(since).Round(time.Second).String()).
					Warn("consumer: the topic still does not exist; nothing is consumed until it is created (mqadmin updateTopic or rmqtx topic create)")
			}
		}
	}()
	return w
}
