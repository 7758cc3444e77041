package inspect

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/txlog"
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

	type obRow struct {
		EventID     string     `db:"event_id"`
		Status      string     `db:"status"`
		Destination string     `db:"destination"`
		EventType   string     `db:"event_type"`
		CreatedAt   time.Time  `db:"created_at"`
		RetryCount  int        `db:"retry_count"`
		LeaseUntil  *time.Time `db:"lease_until"`
		NextRetryAt time.Time  `db:"next_retry_at"`
		LastError   *string    `db:"last_error_message"`
	}
	var ob []obRow
	if err := i.query(ctx, &missing, i.t.outbox, &ob, "SELECT "+strings.Join([]string{outbox.ColEventID, outbox.ColStatus,
		outbox.ColDestination, outbox.ColEventType, outbox.ColCreatedAt, outbox.ColRetryCount, outbox.ColLeaseUntil,
		outbox.ColNextRetryAt, outbox.ColLastError}, ", ")+" FROM "+i.t.outbox+
		" WHERE "+outbox.ColStatus+" IN (?, ?, ?) AND "+outbox.ColCreatedAt+" <= ? ORDER BY "+outbox.ColCreatedAt+", "+outbox.ColEventID+" LIMIT ?",
		outbox.StatusPending, outbox.StatusSending, outbox.StatusRetry, cutoff, limit); err != nil {
		return nil, missing, err
	}
	for _, r := range ob {
		detail := ""
		switch {
		case r.Status == string(outbox.StatusSending) && r.LeaseUntil != nil && r.LeaseUntil.Before(now):
			detail = "lease expired " + fmtAge(now.Sub(*r.LeaseUntil)) + " ago"
		case r.Status == string(outbox.StatusSending) && r.LeaseUntil != nil:
			detail = "lease until " + r.LeaseUntil.UTC().Format(time.RFC3339)
		case r.Status == string(outbox.StatusRetry):
			detail = "next try " + r.NextRetryAt.UTC().Format(time.RFC3339)
		}
		if r.LastError != nil && *r.LastError != "" {
			detail = joinDetail(detail, i.cfg.RedactText(*r.LastError))
		}
		out = append(out, StuckRow{Table: i.t.outbox, Status: r.Status, Key: r.EventID, EventID: r.EventID, Where: r.Destination,
			Type: r.EventType, Since: r.CreatedAt.UTC(), Age: now.Sub(r.CreatedAt), Tries: r.RetryCount, Detail: detail})
	}

	var at []AttemptRow
	if err := i.query(ctx, &missing, i.t.attempt, &at, i.consume.AttemptsSinceSQL(), cutoff, limit); err != nil {
		return nil, missing, err
	}
	for _, r := range at {
		out = append(out, StuckRow{Table: i.t.attempt, Status: "RETRYING", Key: r.EventID, EventID: r.EventID, Where: r.ConsumerGroup,
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
	type row struct {
		Where  string     `db:"w"`
		Status string     `db:"s"`
		Count  int64      `db:"n"`
		Oldest *time.Time `db:"o"`
	}
	for _, q := range []struct{ table, sql string }{
		{i.t.txlog, countSQL(i.t.txlog, txlog.ColProducerGroup, txlog.ColState, txlog.ColCreatedAt)},
		{i.t.outbox, countSQL(i.t.outbox, outbox.ColDestination, outbox.ColStatus, outbox.ColCreatedAt)},
		{i.t.consume, countSQL(i.t.consume, consumer.ColConsumerGroup, consumer.ColStatus, consumer.ColFirstReceivedAt)},
		{i.t.attempt, countSQL(i.t.attempt, consumer.ColConsumerGroup, "'RETRYING'", consumer.ColFirstFailedAt)},
		{i.t.dead, countSQL(i.t.dead, consumer.ColConsumerGroup, consumer.ColStatus, consumer.ColFirstSeenAt)},
		{i.t.audit, countSQL(i.t.audit, "''", replay.ColResult, replay.ColStartedAt)},
	} {
		var rows []row
		if err := i.query(ctx, &missing, q.table, &rows, q.sql); err != nil {
			return nil, missing, err
		}
		for _, r := range rows {
			sr := StatRow{Table: q.table, Where: r.Where, Status: r.Status, Count: r.Count, Oldest: r.Oldest}
			if sr.Oldest != nil {
				u := sr.Oldest.UTC()
				sr.Oldest = &u
			}
			out = append(out, sr)
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

// countSQL counts table's rows grouped by where and status (columns of the
// owner, or a constant in quotes), with the oldest of each group.
func countSQL(table, where, status, at string) string {
	var group []string
	for _, c := range []string{where, status} {
		if !strings.HasPrefix(c, "'") {
			group = append(group, c)
		}
	}
	return "SELECT " + where + " AS w, " + status + " AS s, COUNT(*) AS n, MIN(" + at + ") AS o FROM " + table +
		" GROUP BY " + strings.Join(group, ", ")
}
