// Package metrics holds rmqtx's Prometheus metrics. One *Metrics is created
// per registry and passed to the producer, check-back, outbox, consumer and
// replay through their Config. A nil *Metrics is valid and records nothing,
// so instrumentation never needs an if at the call site.
//
// Labels are bounded: destination (topic or sink name), event type, consumer
// or producer group, error class and result. Event ids and business keys are
// never labels.
package metrics
