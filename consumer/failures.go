package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/wire"
)

// Failure bookkeeping: what follows a failed or undecodable message once its
// transaction (if any) has ended. A retryable failure is counted in the
// consume_attempt table in its own short transaction (fail), so the retry
// bound holds across instances and restarts; past the bound, or for a class
// that is not retried, the message is parked as a dead letter (park). The
// attempt row is deleted with the event's success, stale skip or dedup hit
// whenever it may exist (mayHaveAttempts, txsteps.go).

// loadFailed adds the event ids of the group's attempt rows to the set of
// ids seen failing, so that a process that starts (after a crash, or next to
// an instance that recorded them) deletes such a row when a first delivery of
// its event succeeds. Consumer.Start calls it; an error only loses the hint.
func (p *Processor) loadFailed(ctx context.Context) error {
	var ids []string
	if err := p.db.SelectContext(ctx, &ids, p.q.selectAttemptIDs, p.cfg.Group); err != nil {
		return fmt.Errorf("consumer: read attempts: %w", err)
	}
	for _, id := range ids {
		p.failed.add(id)
	}
	return nil
}

// bookkeeping gives retry and park writes their own deadline: they must run
// even when the message's context has expired.
func bookkeeping(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// fail handles a failed attempt whose transaction has been rolled back.
func (p *Processor) fail(ctx context.Context, m Message, ev Event, c Class, err error) Outcome {
	if !c.Retryable() {
		return p.park(ctx, m, ev, c, err, "", 0)
	}
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	text := clip(p.cfg.RedactText(rmqlog.ScrubText(err.Error())), 2000)
	attempts := ev.Delivery.ReconsumeTimes + 1
	record := p.q.upsertAttempt
	if ev.counted {
		record = p.q.recordCounted // counted before the handler ran (crash.go)
	}
	_, rerr := p.stmts.Exec(bctx, record, p.cfg.Group, ev.ID, string(c), text)
	p.failed.add(ev.ID) // even on an error: the row may have been written
	if rerr == nil {
		rerr = p.stmts.Get(bctx, &attempts, p.q.selectAttempt, p.cfg.Group, ev.ID)
	}
	limit := p.cfg.MaxRetries
	if c == ClassWait {
		limit = p.cfg.MaxWaits
	}
	if rerr == nil && attempts > limit {
		return p.park(ctx, m, ev, c, fmt.Errorf("%w (%d attempts): %w", ErrRetryLimit, attempts, err), "", attempts)
	}
	if rerr != nil {
		// Without the count the broker's reconsume limit still bounds it.
		p.cfg.Logger.WithFields(p.fields(ev)).WithError(rerr).Warn("consumer: cannot record a failed attempt")
	}
	level := p.cfg.DelayLevel(c, attempts)
	p.stats.retries.Add(1)
	metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerRetries }, p.cfg.Group, p.typeLabel(ev), string(c))
	res := ResultRetry
	if errors.Is(err, ErrVersionGap) {
		p.count(ev, "gap")
	} else {
		p.count(ev, res)
	}
	p.cfg.Logger.WithFields(p.fields(ev)).WithField("class", c).WithField("attempt", attempts).
		WithField("error", text).Debug("consumer: attempt failed, redelivery requested")
	return Outcome{Result: res, EventID: ev.ID, Class: c, Err: err, Attempt: attempts, DelayLevel: level}
}

// park stores a dead letter and returns an ACKable outcome, or a retry when
// the dead letter could not be stored (nothing is ACKed unstored).
func (p *Processor) park(ctx context.Context, m Message, ev Event, c Class, cause error, existingHash string, attempts int) Outcome {
	bctx, cancel := bookkeeping(ctx)
	defer cancel()
	payload := p.cfg.Redact(append([]byte(nil), ev.Payload...))
	redacted := !bytes.Equal(payload, ev.Payload)
	props, _ := json.Marshal(replayProperties(m.Properties))
	var existing any
	if existingHash != "" {
		existing = existingHash
	}
	text := clip(p.cfg.RedactText(rmqlog.ScrubText(cause.Error())), 8000)
	d := m.Delivery
	_, id, err := p.d.ExecReturning(bctx, cached{c: p.stmts}, p.q.upsertDeadLetterSQL,
		p.cfg.Group, clip(d.Topic, 255), d.QueueID, d.QueueOffset, clip(d.MsgID, 128), clip(ev.ID, 128),
		clip(ev.Type, 128), clip(ev.BusinessKey, 128), string(c), text, payload, redacted,
		ev.PayloadHash, existing, string(props), d.ReconsumeTimes)
	if err != nil {
		p.cfg.Logger.WithFields(p.fields(ev)).WithError(err).Error("consumer: cannot park a message; it will be redelivered")
		p.stats.retries.Add(1)
		metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerRetries }, p.cfg.Group, p.typeLabel(ev), string(ClassTransient))
		p.count(ev, ResultRetry)
		return Outcome{Result: ResultRetry, EventID: ev.ID, Class: ClassTransient, Err: fmt.Errorf("consumer: park: %w", err),
			Attempt: attempts, DelayLevel: p.cfg.DelayLevel(ClassTransient, max(attempts, d.ReconsumeTimes+1))}
	}
	if attempts > 0 || p.mayHaveAttempts(ev) {
		if _, err := p.stmts.Exec(bctx, p.q.deleteAttempt, p.cfg.Group, ev.ID); err == nil {
			p.failed.remove(ev.ID)
		}
	}
	p.stats.parked.Add(1)
	metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerDeadLetters }, p.cfg.Group, p.typeLabel(ev), string(c))
	result := ResultParked
	if c == ClassConflict {
		result = ResultConflict
		p.stats.conflicts.Add(1)
		metrics.Inc(p.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ConsumerConflicts }, p.cfg.Group, p.typeLabel(ev))
	}
	p.count(ev, result)
	p.cfg.Logger.WithFields(p.fields(ev)).WithField("class", c).WithField("dead_letter_id", id).
		WithField("error", text).Warn("consumer: message parked as a dead letter")
	return Outcome{Result: result, EventID: ev.ID, Class: c, Err: cause, Attempt: attempts, DeadLetterID: id}
}

// upsertDeadLetter parks a message: a new row, or, for the same message
// parked again (group, event id, payload hash), the existing row updated
// with the latest delivery and error, its park count raised, and a
// discarded one kept discarded. Either way the statement yields the row's
// id.
func upsertDeadLetter(d dialect.Dialect, table string) string {
	set := []string{}
	for _, c := range []string{"topic", "queue_id", "queue_offset", "msg_id", "error_class", "error_text", "payload",
		"payload_redacted", "existing_hash", "properties", "reconsume_times"} {
		set = append(set, c+" = "+d.Excluded(c))
	}
	set = append(set, "park_count = park_count + 1",
		"status = CASE WHEN status = '"+DeadLetterDiscarded+"' THEN status ELSE '"+DeadLetterParked+"' END",
		"last_seen_at = "+d.Now())
	return d.UpsertReturning(table,
		"consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key,"+
			" error_class, error_text, payload, payload_redacted, request_hash, existing_hash, properties, reconsume_times,"+
			" park_count, status, first_seen_at, last_seen_at",
		"?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, '"+DeadLetterParked+"', "+d.Now()+", "+d.Now(),
		"consumer_group, event_id, request_hash", strings.Join(set, ", "), "id")
}

// replayProperties keeps what a replay needs to re-publish the message with
// its original identity: the rmqtx envelope and headers, keys and tags, and
// the trace context (so a retry or a replay stays linked to its trace).
func replayProperties(props map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range props {
		switch {
		case k == propReconsume:
		case strings.HasPrefix(k, "RMQTX_"), strings.HasPrefix(k, wire.HeaderPrefix), k == "KEYS", k == "TAGS",
			k == otelx.PropTraceparent, k == otelx.PropTracestate:
			out[k] = v
		}
	}
	return out
}

// malformedEvent builds what can be known of a message whose envelope does
// not decode, for the dead letter. Its id falls back to "msgid:<msg id>".
func malformedEvent(m Message) Event {
	id := m.Properties[wire.PropEventID]
	if id == "" || len(id) > wire.MaxIDLen || !utf8.ValidString(id) {
		msgID := m.Delivery.MsgID
		if msgID == "" {
			msgID = wire.Hash(m.Body)[:32]
		}
		id = "msgid:" + msgID
	}
	return Event{
		ID:          id,
		Type:        m.Properties[wire.PropEventType],
		BusinessKey: m.Properties[wire.PropBusinessKey],
		Payload:     m.Body,
		PayloadHash: wire.Hash(m.Body),
		Delivery:    m.Delivery,
	}
}
