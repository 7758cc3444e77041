package inspect

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/outbox"
)

// StuckRow is one piece of work that has not finished: an outbox row not yet
// SENT or DEAD, a consume attempt being retried, or a PARKED dead letter.
type StuckRow struct {
	Table   string        `json:"table"`
	Status  string        `json:"status"`   // PENDING, SENDING, RETRY, RETRYING, PARKED
	Key     string        `json:"key"`      // event id, or the dead letter id
	EventID string        `json:"event_id"` // the event id
	Where   string        `json:"where"`    // destination or consumer group
	Type    string        `json:"type"`     // event type or error class
	Since   time.Time     `json:"since"`    // created / first failed / first parked
	Age     time.Duration `json:"age_ns"`
	Tries   int           `json:"tries"`  // retry count / attempts / park count
	Detail  string        `json:"detail"` // last error (redacted), lease state
}

// Stuck lists unfinished work older than minAge, oldest first, at most limit
// rows per table (default 100). The txlog has no in-flight state (a
// transaction without a row is in flight or never ran; see the broker's half
// topic), so it has no stuck rows.
func (i *Inspector) Stuck(ctx context.Context, minAge time.Duration, limit int) ([]StuckRow, []string, error) {
	if limit <= 0 {
		limit = 100
	}
	now := i.cfg.Now().UTC()
	cutoff := now.Add(-minAge)
	var missing []string
	var out []StuckRow

	ob, err := i.outbox.Unfinished(ctx, i.cfg.DB, cutoff, limit)
	if err := i.read(&missing, i.t.outbox, err); err != nil {
		return nil, missing, err
	}
	for _, r := range ob {
		detail := ""
		switch {
		case r.Status == outbox.StatusSending && !r.LeaseUntil.IsZero() && r.LeaseUntil.Before(now):
			detail = "lease expired " + fmtAge(now.Sub(r.LeaseUntil)) + " ago"
		case r.Status == outbox.StatusSending && !r.LeaseUntil.IsZero():
			detail = "lease until " + r.LeaseUntil.UTC().Format(time.RFC3339)
		case r.Status == outbox.StatusRetry:
			detail = "next try " + r.NextRetryAt.UTC().Format(time.RFC3339)
		}
		if r.LastErrorMessage != "" {
			detail = joinDetail(detail, i.cfg.RedactText(r.LastErrorMessage))
		}
		out = append(out, StuckRow{Table: i.t.outbox, Status: string(r.Status), Key: r.EventID, EventID: r.EventID, Where: r.Destination,
			Type: r.EventType, Since: r.CreatedAt.UTC(), Age: now.Sub(r.CreatedAt), Tries: r.RetryCount, Detail: detail})
	}

	at, err := i.consume.AttemptsSince(ctx, i.cfg.DB, cutoff, limit)
	if err := i.read(&missing, i.t.attempt, err); err != nil {
		return nil, missing, err
	}
	for _, r := range at {
		out = append(out, StuckRow{Table: i.t.attempt, Status: consumer.StatusRetrying, Key: r.EventID, EventID: r.EventID, Where: r.ConsumerGroup,
			Type: r.LastClass, Since: r.FirstFailedAt.UTC(), Age: now.Sub(r.FirstFailedAt), Tries: r.Attempts,
			Detail: i.cfg.RedactText(r.LastError)})
	}

	dl, err := i.deadLetters(ctx, &missing, consumer.DeadLetterFilter{Status: consumer.DeadLetterParked, NotAfter: cutoff, Limit: limit})
	if err != nil {
		return nil, missing, err
	}
	for _, r := range dl {
		out = append(out, StuckRow{Table: i.t.dead, Status: r.Status, Key: fmt.Sprint(r.ID), EventID: r.EventID, Where: r.ConsumerGroup,
			Type: r.ErrorClass, Since: r.FirstSeenAt.UTC(), Age: now.Sub(r.FirstSeenAt), Tries: r.ParkCount, Detail: r.ErrorText})
	}
	sort.SliceStable(out, func(a, b int) bool {
		if !out[a].Since.Equal(out[b].Since) {
			return out[a].Since.Before(out[b].Since)
		}
		if out[a].Table != out[b].Table {
			return out[a].Table < out[b].Table
		}
		return out[a].Key < out[b].Key
	})
	return orEmpty(out), missing, nil
}

func joinDetail(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// fmtAge renders a duration for humans, coarse and stable: 3d4h, 2h5m, 4m10s, 12s.
func fmtAge(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	d = d.Truncate(time.Second)
	switch {
	case d >= 24*time.Hour:
		return fmt.Sprintf("%dd%dh", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
	case d >= time.Hour:
		return fmt.Sprintf("%dh%dm", d/time.Hour, (d%time.Hour)/time.Minute)
	case d >= time.Minute:
		return fmt.Sprintf("%dm%ds", d/time.Minute, (d%time.Minute)/time.Second)
	}
	return fmt.Sprintf("%ds", d/time.Second)
}

// FormatAge renders a duration the way the runbook prints ages.
func FormatAge(d time.Duration) string { return fmtAge(d) }

// StatRow is a count of rows in one table, grouped by status and by
// destination or consumer group, with the oldest timestamp of the group.
type StatRow struct {
	Table  string     `json:"table"`
	Where  string     `json:"where"` // producer group, destination or consumer group ("" for the txlog by state)
	Status string     `json:"status"`
	Count  int64      `json:"count"`
	Oldest *time.Time `json:"oldest,omitempty"`
}

// Stats counts rows per table, status and group, sorted, and lists missing
// tables.
func (i *Inspector) Stats(ctx context.Context) ([]StatRow, []string, error) {
	var missing []string
	var out []StatRow
	for _, q := range []struct {
		table string
		tally func(fn func(where, status string, rows int64, oldest time.Time)) error
	}{
		{i.t.txlog, func(fn func(string, string, int64, time.Time)) error { return i.txlog.Tally(ctx, fn) }},
		{i.t.outbox, func(fn func(string, string, int64, time.Time)) error { return i.outbox.Tally(ctx, i.cfg.DB, fn) }},
		{i.t.consume, func(fn func(string, string, int64, time.Time)) error {
			return i.consume.TallyConsumeLog(ctx, i.cfg.DB, fn)
		}},
		{i.t.attempt, func(fn func(string, string, int64, time.Time)) error {
			return i.consume.TallyAttempts(ctx, i.cfg.DB, fn)
		}},
		{i.t.dead, func(fn func(string, string, int64, time.Time)) error {
			return i.consume.TallyDeadLetters(ctx, i.cfg.DB, fn)
		}},
		{i.t.audit, func(fn func(string, string, int64, time.Time)) error {
			return i.replays.Tally(ctx, i.cfg.DB, func(result string, runs int64, oldest time.Time) { fn("", result, runs, oldest) })
		}},
	} {
		err := q.tally(func(where, status string, n int64, oldest time.Time) {
			sr := StatRow{Table: q.table, Where: where, Status: status, Count: n}
			if !oldest.IsZero() {
				u := oldest.UTC()
				sr.Oldest = &u
			}
			out = append(out, sr)
		})
		if err := i.read(&missing, q.table, err); err != nil {
			return nil, missing, err
		}
	}
	tableOrder := map[string]int{i.t.txlog: 0, i.t.outbox: 1, i.t.consume: 2, i.t.attempt: 3, i.t.dead: 4, i.t.audit: 5}
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].Table != out[b].Table {
			return tableOrder[out[a].Table] < tableOrder[out[b].Table]
		}
		if out[a].Where != out[b].Where {
			return out[a].Where < out[b].Where
		}
		return out[a].Status < out[b].Status
	})
	sort.Strings(missing)
	return orEmpty(out), missing, nil
}
