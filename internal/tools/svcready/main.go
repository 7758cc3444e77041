// Command svcready waits until a RocketMQ name server and its brokers are
// usable: every broker is registered with the name server under the expected
// loopback address, and a message sent to a queue of that broker, through
// the name server's route, is stored (SEND_OK). scripts/services.sh runs it after starting or restarting the
// broker. One process polls every 300 ms until the deadline; the former
// check started a JVM (mqadmin) per attempt, which on a loaded 2-core
// machine took longer than the broker itself to start.
//
//	go run ./internal/tools/svcready -namesrv 127.0.0.1:9876 -broker broker-a=127.0.0.1:10911 [-broker broker-b=127.0.0.1:11011] -timeout 180s
//
// A broker started with autoCreateTopicEnable=false neither routes the
// default topic TBW102 nor creates the probe topic on its first send: with
// -create-probe-topic svcready waits for the broker in the name server's
// cluster list instead, and creates the probe topic on it before sending.
//
// Exit status 0 when usable, 1 with the last error when the deadline passes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
)

// probeTopic is one topic per broker: a topic that exists on one broker is
// routed to that broker only, so a shared probe topic could never reach a
// second broker. A new topic is routed through TBW102 (autoCreateTopicEnable)
// and created on the broker that stores the send.
func probeTopic(broker string) string { return "RMQTX_SELFTEST_" + broker }

// brokerFlags collects -broker name=addr.
type brokerFlags map[string]string

func (b brokerFlags) String() string { return fmt.Sprint(map[string]string(b)) }
func (b brokerFlags) Set(v string) error {
	name, addr, ok := strings.Cut(v, "=")
	if !ok || name == "" || addr == "" {
		return fmt.Errorf("want name=host:port, got %q", v)
	}
	b[name] = addr
	return nil
}

func main() {
	ns := flag.String("namesrv", "127.0.0.1:9876", "name server address")
	brokers := brokerFlags{}
	flag.Var(brokers, "broker", "name=host:port of a broker that must be usable (repeatable; default broker-a=127.0.0.1:10911)")
	timeout := flag.Duration("timeout", 180*time.Second, "give up after this long")
	create := flag.Bool("create-probe-topic", false, "create the probe topic on each broker (brokers with autoCreateTopicEnable=false)")
	flag.Parse()
	if len(brokers) == 0 {
		brokers["broker-a"] = "127.0.0.1:10911"
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	for name, addr := range brokers {
		stage, err := wait(ctx, *ns, name, addr, *create)
		if err != nil {
			fmt.Fprintf(os.Stderr, "svcready: %s %s: %s not reached after %s: %v\n", name, addr, stage, time.Since(start).Round(time.Second), err)
			os.Exit(1)
		}
		fmt.Printf("svcready: %s %s usable after %s\n", name, addr, time.Since(start).Round(100*time.Millisecond))
	}
}

// wait returns the stage it was in and the last error when ctx ends first.
func wait(ctx context.Context, ns, name, broker string, create bool) (string, error) {
	rmqlog.Install(nil) // the client's own logs stay quiet
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	pause := func(err error) error {
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
			return nil
		}
	}
	// 1. Registered: the name server routes the default topic to broker
	// (lists broker in the cluster, and routes the probe topic created on
	// it, with create).
	for {
		addrs, err := registered(ctx, ns, name, broker, create)
		if err == nil && slices.Contains(addrs, broker) {
			break
		}
		if err == nil {
			err = fmt.Errorf("name server routes %v, want %s", addrs, broker)
		}
		if err := pause(err); err != nil {
			return "broker registered with the name server", err
		}
	}
	// 2. Usable: a send to a queue of this broker, through the route, is
	// stored.
	p, err := rocketmq.NewProducer(
		producer.WithGroupName("rmqtx-svcready"),
		producer.WithInstanceName(fmt.Sprintf("svcready-%d-%s", os.Getpid(), name)),
		producer.WithQueueSelector(producer.NewManualQueueSelector()),
		producer.WithNsResolver(primitive.NewPassthroughResolver([]string{ns})),
		producer.WithSendMsgTimeout(3*time.Second),
		producer.WithRetry(0),
	)
	if err != nil {
		return "producer", err
	}
	if err := p.Start(); err != nil {
		return "producer", err
	}
	defer func() { _ = p.Shutdown() }()
	for {
		msg := primitive.NewMessage(probeTopic(name), []byte("ping"))
		msg.Queue = &primitive.MessageQueue{Topic: probeTopic(name), BrokerName: name, QueueId: 0}
		res, err := p.SendSync(ctx, msg)
		if err == nil && res.Status == primitive.SendOK && res.MessageQueue != nil && res.MessageQueue.BrokerName == name {
			return "", nil
		}
		if err == nil {
			err = fmt.Errorf("send status %d to %v", res.Status, res.MessageQueue)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "a stored send", err
		}
		if err := pause(err); err != nil {
			return "a stored send", err
		}
	}
}

// registered returns the master brokers the name server routes the default
// topic to; with create, it creates the probe topic on broker once the
// name server lists broker in its cluster, and returns the probe topic's
// masters.
func registered(ctx context.Context, ns, name, broker string, create bool) ([]string, error) {
	if !create {
		return remoting.MasterBrokers(ctx, []string{ns}, 2*time.Second, "TBW102")
	}
	masters, err := remoting.ClusterMasters(ctx, []string{ns}, 2*time.Second)
	if err != nil || !slices.Contains(masters, broker) {
		return masters, err
	}
	if err := remoting.CreateTopic(ctx, broker, 2*time.Second, probeTopic(name), 1); err != nil {
		return nil, err
	}
	return remoting.MasterBrokers(ctx, []string{ns}, 2*time.Second, probeTopic(name))
}
