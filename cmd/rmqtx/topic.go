package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/rmqname"
)

// topicView is one broker's part of a created topic (the JSON output).
type topicView struct {
	Topic       string `json:"topic"`
	Cluster     string `json:"cluster"`
	Broker      string `json:"broker"`
	Addr        string `json:"addr"`
	ReadQueues  int    `json:"read_queues"`
	WriteQueues int    `json:"write_queues"`
}

// cmdTopicCreate creates a topic on every master broker of a cluster
// (UPDATE_AND_CREATE_TOPIC, what `mqadmin updateTopic -c` sends) and waits
// until the name server routes it, so that a producer started right after
// finds it. Brokers with autoCreateTopicEnable=false, as most production
// clusters run, refuse sends to a topic nobody created. Creating a topic
// that exists sets its queue counts (as mqadmin does); it never removes
// messages.
func cmdTopicCreate(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) (int, error) {
	// The shared flags too (the database ones are unused), so that every
	// command reads --namesrv, --json and --timeout, and RMQTX_NAMESRV, alike.
	var o options
	fs := newFlags("topic create", stderr, &o, env)
	name := fs.String("name", "", "the topic to create (required)")
	queues := fs.Int("queues", 4, "read and write queues on each master broker")
	cluster := fs.String("cluster", "", "the cluster whose master brokers get the topic (default: the only cluster the name server lists)")
	pos, err := o.parse(fs, args)
	if err != nil {
		return 0, err
	}
	if err := o.validate(); err != nil {
		return 0, err
	}
	if len(pos) > 0 {
		return 0, usageErr("unexpected argument %q (the topic is --name)", pos[0])
	}
	nameServers := o.nameServers()
	if err := rmqname.NameServers(nameServers); err != nil {
		return 0, usageErr("--namesrv (or RMQTX_NAMESRV) %v", err)
	}
	if *name == "" {
		return 0, usageErr("--name is required")
	}
	if err := rmqname.Topic(*name); err != nil || strings.HasPrefix(*name, "%") {
		return 0, usageErr("--name %q: want [a-zA-Z0-9_-]{1,127} (names starting with %% are the broker's own)", *name)
	}
	if *queues < 1 || *queues > 1024 {
		return 0, usageErr("--queues %d: want 1 to 1024", *queues)
	}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	const reqTimeout = 5 * time.Second
	brokers, err := remoting.CreateClusterTopic(ctx, nameServers, reqTimeout, *cluster, *name, *queues)
	if err != nil {
		return 0, err
	}
	route, err := remoting.WaitRouted(ctx, nameServers, reqTimeout, *name, brokers, *queues)
	if err != nil {
		return 0, fmt.Errorf("created topic %s on %d brokers, but the name server does not route it yet: %w", *name, len(brokers), err)
	}
	var views []topicView
	for _, b := range brokers {
		v := topicView{Topic: *name, Cluster: b.Cluster, Broker: b.Name, Addr: b.Addr}
		for _, r := range route {
			if r.Name == b.Name {
				v.ReadQueues, v.WriteQueues = r.ReadQueues, r.WriteQueues
			}
		}
		views = append(views, v)
	}
	return exitOK, o.output(stdout, views, func() error {
		w := newTable(stdout)
		w.row("TOPIC", "CLUSTER", "BROKER", "ADDRESS", "READ QUEUES", "WRITE QUEUES")
		for _, v := range views {
			w.row(v.Topic, v.Cluster, v.Broker, v.Addr, strconv.Itoa(v.ReadQueues), strconv.Itoa(v.WriteQueues))
		}
		return w.flush()
	})
}
