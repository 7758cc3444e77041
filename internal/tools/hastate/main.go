// Command hastate reports, and waits for, the state of a controller-mode
// RocketMQ replica set: which broker the controller made master, and which
// replicas are in its sync state set. scripts/services.sh runs it for the
// HA test bed (RMQTX_BROKERS=ha): `up` waits until the sync state set holds
// every replica, `status` prints who is master, and `kill9 master` asks it
// which node to kill. A Go process answers in milliseconds; mqadmin starts a
// JVM per question, which on a loaded 2-core machine takes seconds.
//
//	go run ./internal/tools/hastate -controller 127.0.0.1:9978 -broker-name broker-a \
//	  -node n0=127.0.0.1:10951 -node n1=127.0.0.1:11051 [-wait-in-sync 2] [-wait-master-not n0] [-timeout 120s]
//
// It prints one line per node, "<node> <addr> <role>", where role is the
// controller's view (master, in-sync, out-of-sync, or unknown when the
// controller does not know the node) followed by the broker's own brokerRole
// (SYNC_MASTER, SLAVE, ...) or "down", and a last line
// "master=<node> epoch=<n> syncStateSet=<ids> syncStateSetEpoch=<n>".
//
// The controller (CONTROLLER_GET_REPLICA_INFO, code 1004) answers with the
// master's id and address in the header, and the sync state set in the body;
// each node's id is its own brokerId once it is a slave (a master reports 0),
// so a node is in sync when it is the master or its brokerId is in the set.
//
// Exit status 0 when the wait conditions hold (or none was given and the
// controller answered), 1 with the last state when the deadline passes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// reqGetReplicaInfo is the controller's CONTROLLER_GET_REPLICA_INFO.
const reqGetReplicaInfo = 1004

type nodeFlags []node

type node struct{ name, addr string }

func (n *nodeFlags) String() string { return fmt.Sprint(*n) }
func (n *nodeFlags) Set(v string) error {
	name, addr, ok := strings.Cut(v, "=")
	if !ok || name == "" || addr == "" {
		return fmt.Errorf("want name=host:port, got %q", v)
	}
	*n = append(*n, node{name, addr})
	return nil
}

// state is the controller's view of the replica set plus each node's own.
type state struct {
	masterID      int64
	masterAddr    string
	masterEpoch   int
	syncSet       []int64
	syncSetEpoch  int
	nodeRole      map[string]string // node name -> the broker's brokerRole, or "down"
	nodeID        map[string]int64  // node name -> the broker's brokerId (-1 when down)
	controllerErr error
}

func main() {
	ctrl := flag.String("controller", "127.0.0.1:9978", "controller address (the DLedger peer address of the controller embedded in the name server)")
	brokerName := flag.String("broker-name", "broker-a", "brokerName of the replica set")
	var nodes nodeFlags
	flag.Var(&nodes, "node", "name=host:port of a replica (repeatable)")
	inSync := flag.Int("wait-in-sync", 0, "wait until the sync state set holds this many replicas, each running with the role the controller gave it")
	masterNot := flag.String("wait-master-not", "", "wait until the master is a node other than this one (a failover)")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after this long")
	quiet := flag.Bool("master-only", false, "print only the master's node name (empty when there is none)")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	for {
		st := read(ctx, *ctrl, *brokerName, nodes)
		err := st.satisfies(nodes, *inSync, *masterNot)
		if err == nil {
			if *quiet {
				fmt.Println(st.masterNode(nodes))
			} else {
				fmt.Print(st.render(nodes))
			}
			return
		}
		if ctx.Err() != nil || (*inSync == 0 && *masterNot == "") {
			fmt.Print(st.render(nodes))
			fmt.Fprintf(os.Stderr, "hastate: %s: not reached after %s: %v\n", *brokerName, time.Since(start).Round(time.Second), err)
			os.Exit(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func read(ctx context.Context, ctrl, brokerName string, nodes []node) state {
	st := state{masterID: -1, nodeRole: map[string]string{}, nodeID: map[string]int64{}}
	h, body, err := remoting.RoundTrip(ctx, ctrl, 2*time.Second, reqGetReplicaInfo, map[string]string{"brokerName": brokerName})
	switch {
	case err != nil:
		st.controllerErr = err
	case h.Code != remoting.ResSuccess:
		st.controllerErr = fmt.Errorf("controller: code %d: %s", h.Code, h.Remark)
	default:
		st.masterAddr = h.ExtFields["masterAddress"]
		if v, err := strconv.ParseInt(h.ExtFields["masterBrokerId"], 10, 64); err == nil {
			st.masterID = v
		}
		st.masterEpoch, _ = strconv.Atoi(h.ExtFields["masterEpoch"])
		var ss struct {
			SyncStateSet      []int64 `json:"syncStateSet"`
			SyncStateSetEpoch int     `json:"syncStateSetEpoch"`
		}
		if len(body) > 0 {
			if err := json.Unmarshal(body, &ss); err != nil {
				st.controllerErr = fmt.Errorf("controller: sync state set %q: %w", body, err)
			}
		}
		sort.Slice(ss.SyncStateSet, func(i, j int) bool { return ss.SyncStateSet[i] < ss.SyncStateSet[j] })
		st.syncSet, st.syncSetEpoch = ss.SyncStateSet, ss.SyncStateSetEpoch
	}
	for _, n := range nodes {
		st.nodeRole[n.name], st.nodeID[n.name] = "down", -1
		conf, err := remoting.BrokerConfig(ctx, n.addr, 2*time.Second)
		if err != nil {
			continue
		}
		st.nodeRole[n.name] = conf["brokerRole"]
		if v, err := strconv.ParseInt(conf["brokerId"], 10, 64); err == nil {
			st.nodeID[n.name] = v
		}
	}
	return st
}

func (st state) masterNode(nodes []node) string {
	for _, n := range nodes {
		if st.masterAddr != "" && n.addr == st.masterAddr {
			return n.name
		}
	}
	return ""
}

// view is the controller's view of node n.
func (st state) view(n node) string {
	switch {
	case st.controllerErr != nil:
		return "unknown"
	case st.masterAddr != "" && n.addr == st.masterAddr:
		return "master"
	case st.nodeID[n.name] > 0 && slices.Contains(st.syncSet, st.nodeID[n.name]):
		return "in-sync"
	case st.nodeID[n.name] > 0:
		return "out-of-sync"
	}
	return "unknown"
}

func (st state) satisfies(nodes []node, inSync int, masterNot string) error {
	if st.controllerErr != nil {
		return st.controllerErr
	}
	master := st.masterNode(nodes)
	if master == "" {
		return errors.New("no master elected (among the nodes given)")
	}
	if masterNot != "" && master == masterNot {
		return fmt.Errorf("%s is still master", master)
	}
	if inSync > 0 {
		if len(st.syncSet) < inSync {
			return fmt.Errorf("sync state set %v, want %d replicas", st.syncSet, inSync)
		}
		// Each node agrees with the controller: the master runs as master
		// (it registers with the name server as brokerId 0), and every other
		// node is a slave in the set.
		ok := 0
		for _, n := range nodes {
			switch v := st.view(n); {
			case v == "master" && strings.HasSuffix(st.nodeRole[n.name], "MASTER"):
				ok++
			case v == "in-sync" && st.nodeRole[n.name] == "SLAVE":
				ok++
			}
		}
		if ok < inSync {
			return fmt.Errorf("%d of %d replicas in sync and running in their role (%s)", ok, inSync, st.brief(nodes))
		}
	}
	return nil
}

func (st state) brief(nodes []node) string {
	var parts []string
	for _, n := range nodes {
		parts = append(parts, fmt.Sprintf("%s %s/%s", n.name, st.view(n), st.nodeRole[n.name]))
	}
	return strings.Join(parts, ", ")
}

func (st state) render(nodes []node) string {
	var b strings.Builder
	for _, n := range nodes {
		fmt.Fprintf(&b, "%-8s %-21s %-11s %s\n", n.name, n.addr, st.view(n), st.nodeRole[n.name])
	}
	if st.controllerErr != nil {
		fmt.Fprintf(&b, "controller: %v\n", st.controllerErr)
		return b.String()
	}
	ids := make([]string, len(st.syncSet))
	for i, id := range st.syncSet {
		ids[i] = strconv.FormatInt(id, 10)
	}
	fmt.Fprintf(&b, "master=%s masterId=%d epoch=%d syncStateSet=%s syncStateSetEpoch=%d\n",
		st.masterNode(nodes), st.masterID, st.masterEpoch, strings.Join(ids, ","), st.syncSetEpoch)
	return b.String()
}
