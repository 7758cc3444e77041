package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler returns an http.Handler that serves the metrics gathered from g
// (the registry passed to New) in the Prometheus exposition format. Mount it
// on your service's admin port, for example mux.Handle("/metrics", Handler(reg)).
// A collector that fails to gather is reported in the response and the rest
// is still served.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
