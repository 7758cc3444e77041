// Package observe is how every rmqtx component is watched: one struct,
// Observe, embedded in every Config (txproducer, checkback, discard,
// consumer, outbox and its RocketMQ sink, replay, archive), holds the
// logger, the metrics and the tracer provider, with the same defaults
// everywhere. One Observe value can be handed to every component; one that
// records no metrics or spans (the sink, the archiver) says so on its
// Config and uses the Logger only.
//
// rocketmq-client-go logs through one process-wide logger. rmqtx routes it
// (scrubbed of message bodies and property values) to the Logger of the
// first component started in the process; a component started later with
// a different Logger says so once, on its own Logger, at Info. Call
// RouteClientLog to send the client's lines somewhere on purpose.
package observe

import (
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/metrics"
)

// Observe is embedded in each component's Config. The zero value observes
// nothing: no log lines, no metrics, no spans.
type Observe struct {
	// Logger receives the component's log lines. Default: a quiet logger
	// (nothing is written). Lines never carry payloads or credentials.
	Logger logrus.FieldLogger
	// Metrics records the component's metrics (metrics.New). Nil records
	// nothing.
	Metrics *metrics.Metrics
	// TracerProvider records OpenTelemetry spans for the component's work,
	// linked across the broker through the message properties. Nil, the
	// default, records none and costs nothing.
	TracerProvider trace.TracerProvider
}

// WithDefaults returns o with a quiet Logger when none is set.
func (o Observe) WithDefaults() Observe {
	o.Logger = rmqlog.OrQuiet(o.Logger)
	return o
}

// RouteClientLog sends rocketmq-client-go's log lines to l (quiet when nil)
// from now on, whichever component was started first. The lines are
// scrubbed of message bodies and property values; the client's Info lines
// arrive at Debug.
func RouteClientLog(l logrus.FieldLogger) { rmqlog.Route(l) }
