package metrics_test

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmqtx/rmqtx/metrics"
)

// Serve rmqtx's metrics from an injectable registry and scrape them.
func ExampleHandler() {
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		panic(err)
	}
	// Pass m in the Config of the producer, outbox, consumer and replayer;
	// here one counter is bumped by hand.
	m.ConsumerDedupHits.WithLabelValues("points", "PaymentSucceeded").Inc()

	srv := httptest.NewServer(metrics.Handler(reg)) // in a service: mux.Handle("/metrics", metrics.Handler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "rmqtx_consumer_dedup_hits_total{") {
			fmt.Println(sc.Text())
		}
	}
	// Output:
	// rmqtx_consumer_dedup_hits_total{consumer_group="points",event_type="PaymentSucceeded"} 1
}
