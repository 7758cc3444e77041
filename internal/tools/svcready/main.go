// Command svcready waits until a RocketMQ name server and broker are usable:
// the broker is registered with the name server under the expected loopback
// address, and a message sent through the name server's route is stored
// (SEND_OK). scripts/services.sh runs it after starting or restarting the
// broker. One process polls every 300 ms until the deadline; the former
// check started a JVM (mqadmin) per attempt, which on a loaded 2-core
// machine took longer than the broker itself to start.
//
//	go run ./internal/tools/svcready -namesrv 127.0.0.1:9876 -broker 127.0.0.1:10911 -timeout 180s
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
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/internal/remoting"
	"github.com/rmqtx/rmqtx/internal/rmqlog"
)

const probeTopic = "RMQTX_SELFTEST"

func main() {
	ns := flag.String("namesrv", "127.0.0.1:9876", "name server address")
	broker := flag.String("broker", "127.0.0.1:10911", "the broker address that must be registered")
	timeout := flag.Duration("timeout", 180*time.Second, "give up after this long")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	stage, err := wait(ctx, *ns, *broker)
	if err != nil {
		fmt.Fprintf(os.Stderr, "svcready: %s not reached after %s: %v\n", stage, time.Since(start).Round(time.Second), err)
		os.Exit(1)
	}
	fmt.Printf("svcready: broker %s usable after %s\n", *broker, time.Since(start).Round(100*time.Millisecond))
}

// wait returns the stage it was in and the last error when ctx ends first.
func wait(ctx context.Context, ns, broker string) (string, error) {
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
	// 1. Registered: the name server routes the default topic to broker.
	for {
		addrs, err := remoting.MasterBrokers(ctx, []string{ns}, 2*time.Second, "TBW102")
		if err == nil && slices.Contains(addrs, broker) {
			break
		}
		if err == nil {
			err = fmt.Errorf("name server routes TBW102 to %v, want %s", addrs, broker)
		}
		if err := pause(err); err != nil {
			return "broker registered with the name server", err
		}
	}
	// 2. Usable: a send through the route is stored.
	p, err := rocketmq.NewProducer(
		producer.WithGroupName("rmqtx-svcready"),
		producer.WithInstanceName(fmt.Sprintf("svcready-%d", os.Getpid())),
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
		res, err := p.SendSync(ctx, primitive.NewMessage(probeTopic, []byte("ping")))
		if err == nil && res.Status == primitive.SendOK {
			return "", nil
		}
		if err == nil {
			err = fmt.Errorf("send status %d", res.Status)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return "a stored send", err
		}
		if err := pause(err); err != nil {
			return "a stored send", err
		}
	}
}
