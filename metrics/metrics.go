package metrics

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

const namespace = "rmqtx"

// Metrics is the set of rmqtx collectors registered on one registry.
type Metrics struct {
	OutboxPending       *prometheus.GaugeVec     // rows PENDING/RETRY by destination
	OutboxOldestAge     *prometheus.GaugeVec     // seconds since the oldest unsent row was created
	OutboxClaimLatency  prometheus.Histogram     // claim transaction duration
	OutboxSends         *prometheus.CounterVec   // result=success|retry|dead|unknown
	OutboxLeaseExpired  *prometheus.CounterVec   // rows taken over after an expired lease
	CheckbackAnswers    *prometheus.CounterVec   // result=commit|rollback|unknown
	CheckbackFences     *prometheus.CounterVec   // ROLLED_BACK rows written by a check
	CheckbackDuration   prometheus.Histogram     // time to answer one check
	DiscardRecoveries   *prometheus.CounterVec   // decision=republished|dropped|fenced|conflict|no_payload|failed
	DiscardUndecided    *prometheus.GaugeVec     // discarded halves recovery holds, not yet decided
	ConsumerProcessed   *prometheus.CounterVec   // result=applied|duplicate|conflict|stale|gap|retry|parked
	ConsumerDedupHits   *prometheus.CounterVec   // duplicates absorbed
	ConsumerConflicts   *prometheus.CounterVec   // same id, different payload hash
	ConsumerStale       *prometheus.CounterVec   // older aggregate version skipped
	ConsumerGaps        *prometheus.CounterVec   // strict mode waited for a missing version
	ConsumerRetries     *prometheus.CounterVec   // redelivery requested, by error class
	ConsumerDeadLetters *prometheus.CounterVec   // parked, by error class
	ConsumerLag         *prometheus.HistogramVec // seconds from store to commit of the effect
	ReplayMessages      *prometheus.CounterVec   // result=sent|failed|skipped
	ReplayRate          prometheus.Gauge         // configured messages/second of the running replay
	ProducerSends       *prometheus.CounterVec   // result=committed|duplicate|rolled_back|forced_rollback|unknown|error
}

// New creates the collectors and registers them on reg. Pass
// prometheus.NewRegistry() in tests; prometheus.DefaultRegisterer in a
// service that already exposes the default registry.
func New(reg prometheus.Registerer) (*Metrics, error) {
	cv := func(sub, name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: sub, Name: name, Help: help}, labels)
	}
	gv := func(sub, name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Subsystem: sub, Name: name, Help: help}, labels)
	}
	m := &Metrics{
		OutboxPending:   gv("outbox", "pending_rows", "Outbox rows waiting to be sent (PENDING or RETRY).", "destination"),
		OutboxOldestAge: gv("outbox", "oldest_age_seconds", "Age of the oldest outbox row not yet SENT or DEAD.", "destination"),
		OutboxClaimLatency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Subsystem: "outbox", Name: "claim_latency_seconds",
			Help: "Duration of one claim transaction (SELECT ... FOR UPDATE SKIP LOCKED + UPDATE).", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		OutboxSends:        cv("outbox", "sends_total", "Outbox send attempts by result (success, retry, dead, unknown).", "destination", "event_type", "result", "error_class"),
		OutboxLeaseExpired: cv("outbox", "lease_expired_total", "Outbox rows claimed after another dispatcher's lease expired.", "destination"),
		CheckbackAnswers:   cv("checkback", "answers_total", "Transaction check answers by result (commit, rollback, unknown).", "group", "result"),
		CheckbackFences:    cv("checkback", "fences_total", "Transactions fenced (ROLLED_BACK written) by a check or recovery.", "group"),
		CheckbackDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Subsystem: "checkback", Name: "answer_seconds",
			Help: "Time to answer one transaction check.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		DiscardRecoveries: cv("checkback", "discard_recoveries_total", "Recovery outcomes for half messages the broker discarded: decisions, and failed attempts (retried).", "group", "decision"),
		DiscardUndecided: gv("checkback", "discard_undecided", "Half messages the broker discarded (TRANS_CHECK_MAX_TIME_TOPIC) that recovery has received and not decided yet; "+
			"it retries each until decided, so a value above 0 for long means recovery cannot reach its database or the broker.", "group"),
		ConsumerProcessed:   cv("consumer", "messages_total", "Messages handled by the idempotent consumer, by result.", "consumer_group", "event_type", "result"),
		ConsumerDedupHits:   cv("consumer", "dedup_hits_total", "Duplicate deliveries absorbed by the consume log.", "consumer_group", "event_type"),
		ConsumerConflicts:   cv("consumer", "conflicts_total", "Same event id with a different payload hash (parked).", "consumer_group", "event_type"),
		ConsumerStale:       cv("consumer", "stale_versions_total", "Events skipped because a newer aggregate version was already applied.", "consumer_group", "event_type"),
		ConsumerGaps:        cv("consumer", "version_gaps_total", "Events held back in strict mode because an earlier version is missing.", "consumer_group", "event_type"),
		ConsumerRetries:     cv("consumer", "retries_total", "Deliveries handed back to the broker for a later retry.", "consumer_group", "event_type", "error_class"),
		ConsumerDeadLetters: cv("consumer", "dead_letters_total", "Messages parked as dead letters.", "consumer_group", "event_type", "error_class"),
		ConsumerLag: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Subsystem: "consumer", Name: "lag_seconds",
			Help: "Seconds from the broker storing a message to its effect committing.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}, []string{"consumer_group"}),
		ReplayMessages: cv("replay", "messages_total", "Dead letters replayed, by result (sent, failed, skipped).", "destination", "result"),
		ReplayRate: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Subsystem: "replay", Name: "rate_limit",
			Help: "Messages per second allowed for the replay in progress (0 when none runs)."}),
		ProducerSends: cv("txproducer", "sends_total", "Transactional sends by outcome (committed, duplicate: the event id was already committed, rolled_back, "+
			"forced_rollback: the broker stored the half with a slave or flush timeout and the client rolled it back, unknown, error).", "group", "event_type", "result"),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range m.collectors() {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("metrics: %w (create one *Metrics per registry)", err)
			}
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.OutboxPending, m.OutboxOldestAge, m.OutboxClaimLatency, m.OutboxSends, m.OutboxLeaseExpired,
		m.CheckbackAnswers, m.CheckbackFences, m.CheckbackDuration, m.DiscardRecoveries, m.DiscardUndecided,
		m.ConsumerProcessed, m.ConsumerDedupHits, m.ConsumerConflicts, m.ConsumerStale, m.ConsumerGaps,
		m.ConsumerRetries, m.ConsumerDeadLetters, m.ConsumerLag, m.ReplayMessages, m.ReplayRate, m.ProducerSends,
	}
}

// Inc adds one to a counter vector with the given label values; nil-safe, so
// callers can write m.Inc(m.OutboxSends(...)) without checking m. Use it as
// metrics.Inc(m, func(m *Metrics) *prometheus.CounterVec { return m.X }, labels...).
func Inc(m *Metrics, pick func(*Metrics) *prometheus.CounterVec, labels ...string) {
	if m == nil {
		return
	}
	pick(m).WithLabelValues(labels...).Inc()
}

// Add adds delta to a gauge vector with the given label values; nil-safe
// like Inc.
func Add(m *Metrics, pick func(*Metrics) *prometheus.GaugeVec, delta float64, labels ...string) {
	if m == nil {
		return
	}
	pick(m).WithLabelValues(labels...).Add(delta)
}
