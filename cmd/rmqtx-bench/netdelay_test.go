package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// echoServer accepts on loopback and writes back everything it reads; it
// stops (and waits for its goroutines) at the end of the test.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				closeWrite(c)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func TestDelayProxyAddsTheDelayEachWay(t *testing.T) {
	t.Parallel()
	const delay = 10 * time.Millisecond
	p, err := startDelayProxy(echoServer(t), delay, nil)
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 5)
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		_, err := c.Write([]byte("ping!"))
		require.NoError(t, err)
		_, err = io.ReadFull(c, buf)
		require.NoError(t, err)
		rtt := time.Since(t0)
		require.Equal(t, "ping!", string(buf))
		require.GreaterOrEqual(t, rtt, 2*delay, "round trip %d through the proxy: once each way", i)
	}
}

func TestDelayProxyPreservesBytesAndOrder(t *testing.T) {
	t.Parallel()
	p, err := startDelayProxy(echoServer(t), 500*time.Microsecond, nil)
	require.NoError(t, err)
	defer p.Close()

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	want := make([]byte, 2<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	// Many writes of random sizes, read back concurrently: the chunks the
	// proxy forwards do not line up with the writes.
	errc := make(chan error, 1)
	go func() {
		rest := want
		for len(rest) > 0 {
			n := min(len(rest), 1+rng.IntN(70000))
			if _, err := c.Write(rest[:n]); err != nil {
				errc <- err
				return
			}
			rest = rest[n:]
		}
		errc <- c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(c) // until the echo's half-close comes back through the proxy
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Equal(t, len(want), len(got))
	require.True(t, bytes.Equal(want, got), "bytes changed or reordered")
	require.Greater(t, p.chunks.Load(), int64(2), "forwarded in chunks, both ways")
	require.Equal(t, int64(2*len(want)), p.bytes.Load())
}

func TestDelayProxyCloseEndsEveryGoroutine(t *testing.T) {
	t.Parallel()
	p, err := startDelayProxy(echoServer(t), time.Millisecond, nil)
	require.NoError(t, err)
	var conns []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", p.Addr())
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte("x"))
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 1))
		require.NoError(t, err)
		conns = append(conns, c)
	}
	require.Greater(t, p.live.Load(), int64(1), "connections in flight")
	p.Close()
	require.Equal(t, int64(0), p.live.Load(), "Close waits for every goroutine of the proxy")
	for _, c := range conns {
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err, "the proxy closed the client's connection")
	}
	p.Close() // idempotent
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	require.Error(t, err, "the listener is closed")
}

func TestDelayProxyRefusesNonLoopbackTargets(t *testing.T) {
	t.Parallel()
	_, err := startDelayProxy("192.0.2.1:3306", time.Millisecond, nil)
	require.ErrorContains(t, err, "not a loopback address")
	_, err = startDelayProxy("db.example:3306", time.Millisecond, nil)
	require.Error(t, err)
}

// nsFrame encodes a remoting response the way the name server writes it:
// length, serialization type 0 (JSON) and header length, header, body.
func nsFrame(t *testing.T, h remoting.Header, body []byte) []byte {
	t.Helper()
	hb, err := json.Marshal(h)
	require.NoError(t, err)
	f := make([]byte, 8, 8+len(hb)+len(body))
	binary.BigEndian.PutUint32(f[0:4], uint32(4+len(hb)+len(body)))
	binary.BigEndian.PutUint32(f[4:8], uint32(len(hb)))
	f = append(f, hb...)
	return append(f, body...)
}

// decodeFrame decodes a whole frame with the remoting codec's layout,
// checking its length prefix.
func decodeFrame(t *testing.T, f []byte) (remoting.Header, []byte) {
	t.Helper()
	require.GreaterOrEqual(t, len(f), 8)
	require.Equal(t, uint32(len(f)-4), binary.BigEndian.Uint32(f[0:4]), "length prefix")
	mark := binary.BigEndian.Uint32(f[4:8])
	require.Zero(t, mark>>24, "JSON header")
	hl := int(mark & 0xFFFFFF)
	var h remoting.Header
	require.NoError(t, json.Unmarshal(f[8:8+hl], &h))
	return h, f[8+hl:]
}

// routeBody is a GET_ROUTEINFO_BY_TOPIC answer as a 5.3 name server writes
// it (unquoted integer keys): broker-a has a master and a slave.
func routeBody(master, slave string) []byte {
	return []byte(`{"brokerDatas":[{"brokerAddrs":{0:"` + master + `",1:"` + slave + `"},"brokerName":"broker-a","cluster":"DefaultCluster","enableActingMaster":false}],` +
		`"filterServerTable":{},"queueDatas":[{"brokerName":"broker-a","perm":6,"readQueueNums":4,"topicSysFlag":0,"writeQueueNums":4}]}`)
}

func TestRewriteBrokerAddrsFixesTheFrame(t *testing.T) {
	t.Parallel()
	proxies := map[string]string{"127.0.0.1:10911": "127.0.0.1:40001", "127.0.0.1:10921": "127.0.0.1:40002"}
	addr := func(real string) string { return proxies[real] }
	h := remoting.Header{Code: remoting.ResSuccess, Language: "JAVA", Version: 475, Opaque: 42, Flag: 1}

	// A route: both addresses replaced, a longer body, the length fixed.
	in := nsFrame(t, h, routeBody("127.0.0.1:10911", "127.0.0.1:10921"))
	out := rewriteBrokerAddrs(in, addr)
	gotH, body := decodeFrame(t, out)
	require.Equal(t, h.Opaque, gotH.Opaque)
	require.Equal(t, h.Code, gotH.Code)
	route, err := remoting.ParseRoute(body)
	require.NoError(t, err)
	require.Len(t, route, 1)
	require.Equal(t, "127.0.0.1:40001", route[0].Addr)
	require.Equal(t, 4, route[0].WriteQueues)
	require.Contains(t, string(body), `1:"127.0.0.1:40002"`, "the slave too")
	require.NotContains(t, string(body), "1091", "no real address left")

	// The cluster list (quoted keys here): the same rewrite.
	cluster := []byte(`{"brokerAddrTable":{"broker-a":{"brokerAddrs":{"0":"127.0.0.1:10911"},"brokerName":"broker-a","cluster":"DefaultCluster"}},"clusterAddrTable":{"DefaultCluster":["broker-a"]}}`)
	_, body = decodeFrame(t, rewriteBrokerAddrs(nsFrame(t, h, cluster), addr))
	brokers, err := remoting.ParseClusterInfo(body)
	require.NoError(t, err)
	require.Len(t, brokers, 1)
	require.Equal(t, "127.0.0.1:40001", brokers[0].Addr)

	// Anything else passes unchanged.
	other := nsFrame(t, h, []byte(`{"brokerName":"broker-a"}`))
	require.Equal(t, other, rewriteBrokerAddrs(other, addr))
	empty := nsFrame(t, h, nil)
	require.Equal(t, empty, rewriteBrokerAddrs(empty, addr))
}

// fakeNameServer answers every request with a route naming broker as
// broker-a's master, echoing the request's opaque.
func fakeNameServer(t *testing.T, broker string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					var head [4]byte
					if _, err := io.ReadFull(r, head[:]); err != nil {
						return
					}
					f := make([]byte, binary.BigEndian.Uint32(head[:]))
					if _, err := io.ReadFull(r, f); err != nil {
						return
					}
					var req remoting.Header
					if json.Unmarshal(f[4:4+int(binary.BigEndian.Uint32(f[0:4])&0xFFFFFF)], &req) != nil {
						return
					}
					h := remoting.Header{Code: remoting.ResSuccess, Language: "JAVA", Version: 475, Opaque: req.Opaque, Flag: 1}
					hb, _ := json.Marshal(h)
					body := routeBody(broker, "127.0.0.1:1")
					out := make([]byte, 8, 8+len(hb)+len(body))
					binary.BigEndian.PutUint32(out[0:4], uint32(4+len(hb)+len(body)))
					binary.BigEndian.PutUint32(out[4:8], uint32(len(hb)))
					out = append(append(out, hb...), body...)
					if _, err := c.Write(out); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

// Through the name server's proxy, a client reading routes with the
// remoting codec finds the broker at its delay proxy, which reaches the
// real broker.
func TestNameServerProxyRoutesClientsToBrokerProxies(t *testing.T) {
	t.Parallel()
	broker := echoServer(t) // stands in for the broker: bytes come back
	const delay = 5 * time.Millisecond
	nd, err := startNetDelay(echoServer(t), fakeNameServer(t, broker), delay)
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			nd.Close()
		}
	}()

	ctx := context.Background()
	t0 := time.Now()
	route, err := remoting.TopicRoute(ctx, []string{nd.ns.Addr()}, 5*time.Second, "T")
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(t0), 2*delay, "the name server's round trip is delayed")
	require.Len(t, route, 1)
	require.NotEqual(t, broker, route[0].Addr, "the route names the broker's proxy")
	require.Equal(t, nd.brokerAddr(broker), route[0].Addr)

	// The same answer twice: one proxy per broker.
	again, err := remoting.TopicRoute(ctx, []string{nd.ns.Addr()}, 5*time.Second, "T")
	require.NoError(t, err)
	require.Equal(t, route[0].Addr, again[0].Addr)

	c, err := net.Dial("tcp", route[0].Addr)
	require.NoError(t, err)
	defer c.Close()
	t0 = time.Now()
	_, err = c.Write([]byte("hello"))
	require.NoError(t, err)
	got := make([]byte, 5)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	require.GreaterOrEqual(t, time.Since(t0), 2*delay, "the broker's round trip is delayed")
	require.Contains(t, nd.Summary(), "broker "+broker+" via "+route[0].Addr)

	bp := nd.brokers[broker]
	nd.Close()
	closed = true
	require.Zero(t, nd.ns.live.Load())
	require.Zero(t, nd.db.live.Load())
	require.Zero(t, bp.live.Load())
	require.Empty(t, nd.Warnings())
	require.Equal(t, "127.0.0.1:9", nd.brokerAddr("127.0.0.1:9"), "no proxy starts after Close")
}

// latSide is a producer side with per-round p50 and p99 latencies.
func latSide(name string, p50, p99 []float64) *Side {
	s := &Side{Name: name, Unit: "tx/s"}
	for i := range p50 {
		s.Rounds = append(s.Rounds, Round{Index: i + 1, Count: 100, Seconds: 1, Rate: 100, P50Ms: p50[i], P99Ms: p99[i]})
	}
	s.Summarize()
	return s
}

// With -net-delay the producer reports p50 and p99 against both raw tx
// sides and judges rmqtx's p50 against the hand-written log's: at most
// 1.00x, a target line that says met or missed.
func TestLatencyRatiosOnANetwork(t *testing.T) {
	t.Parallel()
	mk := func(net bool, sendP50 []float64) *Workload {
		w := &Workload{Name: "producer", Params: map[string]string{}, Sides: []*Side{
			latSide(sideRawTx, []float64{3, 3, 3}, []float64{8, 8, 8}),
			latSide(sideRawTxLog, []float64{4, 4, 4}, []float64{10, 10, 10}),
			latSide(sideRmqtxSend, sendP50, []float64{11, 13, 11}),
		}}
		if net {
			w.Params["net_delay"] = "500µs each way"
		}
		addRatios(w)
		return w
	}
	byName := func(w *Workload) map[string]Ratio {
		m := map[string]Ratio{}
		for _, r := range w.Ratios {
			m[r.Name] = r
		}
		return m
	}

	w := mk(true, []float64{3.6, 4.4, 3.8}) // per round 0.9, 1.1, 0.95: median 0.95
	r := byName(w)
	p50 := r["rmqtx Send p50 / raw tx + txlog p50"]
	require.InDelta(t, 0.95, p50.Value, 1e-9)
	require.True(t, p50.AtMost)
	require.Equal(t, "target <= 1.00x: met", p50.TargetText())
	p99 := r["rmqtx Send p99 / raw tx + txlog p99"]
	require.InDelta(t, 1.1, p99.Value, 1e-9)
	require.Equal(t, "target <= 1.20x: met", p99.TargetText())
	require.InDelta(t, 3.8/3, r["rmqtx Send p50 / raw tx producer p50"].Value, 1e-9)
	require.Nil(t, r["rmqtx Send p50 / raw tx producer p50"].Target)
	require.Contains(t, r, "rmqtx Send p99 / raw tx producer p99")
	require.Contains(t, r, "rmqtx Send / raw tx producer (tx/s)")
	require.Contains(t, r, "rmqtx Send / raw tx producer + txlog")
	require.Contains(t, strings.Join(w.Notes, "\n"), p50OverlapClaim+"): met")

	slow := byName(mk(true, []float64{4.4, 4.4, 4.4}))["rmqtx Send p50 / raw tx + txlog p50"]
	require.Equal(t, "target <= 1.00x: missed", slow.TargetText())

	// On loopback only issue 25's p99 target is judged.
	r = byName(mk(false, []float64{3.6, 4.4, 3.8}))
	require.NotContains(t, r, "rmqtx Send p50 / raw tx + txlog p50")
	require.Contains(t, r, "rmqtx Send p99 / raw tx + txlog p99")

	// Every target line says met or missed, also without a value, and
	// the header states the delay.
	rep := &Report{StartedAt: time.Unix(0, 0), Settings: map[string]string{"net_delay": "500µs"}, Workloads: []*Workload{w,
		{Name: "consumer", Ratios: []Ratio{NewRatio("rmqtx batch mode / raw batch handler", side("a", 1), side("b", 0), targetBatch)}}}}
	rep.Finish()
	var buf bytes.Buffer
	rep.WriteTable(&buf)
	out := buf.String()
	require.Contains(t, out, "network: 500µs each way")
	require.Contains(t, out, "target >= 0.90x: missed (no value)")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "target ") && strings.HasPrefix(strings.TrimSpace(line), "ratio") {
			require.Regexp(t, `target [<>]= \d+\.\d\dx: (met|missed)`, line)
		}
	}
	require.Equal(t, rep.TargetsAll, strings.Count(out, "x: met")+strings.Count(out, "x: missed"))
}
