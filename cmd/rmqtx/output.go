package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rmqtx/rmqtx/archive"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/replay"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer) *table { return &table{tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)} }

func (t *table) row(cells ...string) {
	for i, c := range cells {
		cells[i] = oneLine(c)
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// oneLine keeps a cell on one line and short enough to read.
func oneLine(s string) string {
	s = strings.NewReplacer("\n", " ", "\r", " ", "\t", " ").Replace(s)
	if r := []rune(s); len(r) > 100 {
		s = string(r[:99]) + "…"
	}
	if s == "" {
		return "-"
	}
	return s
}

func ts(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000")
}

func tsp(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return ts(*t)
}

func str(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}

func age(now, t time.Time) string { return inspect.FormatAge(now.Sub(t)) }

func section(w io.Writer, title string) { fmt.Fprintf(w, "\n== %s\n", title) }

func printEvent(w io.Writer, v inspect.EventView, now time.Time) error {
	fmt.Fprintf(w, "event %s\n", v.EventID)
	section(w, "txlog")
	if v.Txlog == nil {
		fmt.Fprintln(w, "(no row)")
	} else {
		r := v.Txlog
		t := newTable(w)
		t.row("state", r.State+" by "+r.ResolvedBy)
		t.row("producer group", r.ProducerGroup)
		t.row("topic / tags", r.Topic+" / "+r.Tags)
		t.row("keys", r.Keys)
		t.row("event type", r.EventType)
		t.row("business key", r.BusinessKey)
		t.row("created", ts(r.CreatedAt)+" ("+age(now, r.CreatedAt)+" ago)")
		t.row("resolved", ts(r.ResolvedAt))
		if r.RecoveryDecision != nil {
			t.row("recovery", *r.RecoveryDecision+" at "+tsp(r.RecoveredAt)+": "+str(r.RecoveryNote))
		}
		t.row("payload", r.Payload)
		t.row("payload sha256", r.PayloadHash)
		if err := t.flush(); err != nil {
			return err
		}
	}
	section(w, "outbox")
	if v.Outbox == nil {
		fmt.Fprintln(w, "(no row)")
	} else {
		r := v.Outbox
		t := newTable(w)
		t.row("status", r.Status)
		t.row("destination", r.Destination)
		t.row("event type", r.EventType)
		t.row("aggregate", fmt.Sprintf("%s/%s v%d", r.AggregateType, r.AggregateID, r.AggregateVersion))
		t.row("message key", r.MessageKey)
		t.row("retries", strconv.Itoa(r.RetryCount)+", next "+ts(r.NextRetryAt))
		if r.OwnerToken != nil {
			t.row("owner / lease", *r.OwnerToken+" until "+tsp(r.LeaseUntil))
		}
		if r.LastErrorCode != nil || r.LastErrorMessage != nil {
			t.row("last error", str(r.LastErrorCode)+": "+str(r.LastErrorMessage))
		}
		t.row("created", ts(r.CreatedAt)+" ("+age(now, r.CreatedAt)+" ago)")
		t.row("sent", tsp(r.SentAt))
		t.row("payload", r.Payload)
		if err := t.flush(); err != nil {
			return err
		}
	}
	section(w, "consume log")
	if len(v.Consumed) == 0 {
		fmt.Fprintln(w, "(no group applied it)")
	} else {
		t := newTable(w)
		t.row("GROUP", "STATUS", "FIRST RECEIVED", "UPDATED", "RESULT REF", "HASH")
		for _, r := range v.Consumed {
			t.row(r.ConsumerGroup, r.Status, ts(r.FirstReceivedAt), ts(r.UpdatedAt), str(r.ResultRef), short(r.RequestHash))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	section(w, "consume attempts (retrying)")
	if len(v.Attempts) == 0 {
		fmt.Fprintln(w, "(none)")
	} else {
		t := newTable(w)
		t.row("GROUP", "ATTEMPTS", "CLASS", "FIRST FAILED", "LAST ERROR")
		for _, r := range v.Attempts {
			t.row(r.ConsumerGroup, strconv.Itoa(r.Attempts), r.LastClass, ts(r.FirstFailedAt), r.LastError)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	section(w, "dead letters")
	if err := printDeadRows(w, v.DeadLetters, "(none)"); err != nil {
		return err
	}
	section(w, "replays")
	if len(v.Replays) == 0 {
		fmt.Fprintln(w, "(none)")
	} else {
		t := newTable(w)
		t.row("AUDIT", "DEAD LETTER", "RESULT", "AT", "OPERATOR", "REASON")
		for _, r := range v.Replays {
			t.row(strconv.FormatInt(r.AuditID, 10), strconv.FormatInt(r.DeadLetterID, 10), r.Result, ts(r.At), r.Operator, r.Reason)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if v.Broker != nil || len(v.BrokerErrors) > 0 {
		section(w, "broker (by key)")
		if len(v.Broker) == 0 {
			fmt.Fprintln(w, "(no message with this key)")
		} else {
			t := newTable(w)
			t.row("KIND", "TOPIC", "QUEUE", "OFFSET", "STORED", "OFFSET MSG ID", "REPLAY AUDIT", "BODY")
			for _, m := range v.Broker {
				topic := m.Topic
				if m.RealTopic != "" && m.RealTopic != m.Topic {
					topic += " (" + m.RealTopic + ")"
				}
				t.row(m.Kind, topic, strconv.Itoa(m.QueueID), strconv.FormatInt(m.QueueOffset, 10), ts(m.StoredAt), m.OffsetMsgID,
					m.ReplayAuditID, strconv.Itoa(m.BodySize)+" bytes")
			}
			if err := t.flush(); err != nil {
				return err
			}
		}
		keys := make([]string, 0, len(v.BrokerErrors))
		for k := range v.BrokerErrors {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "lookup in %s failed: %s\n", k, v.BrokerErrors[k])
		}
	}
	if len(v.Missing) > 0 {
		fmt.Fprintf(w, "\nmissing tables: %s\n", strings.Join(v.Missing, ", "))
	}
	return nil
}

func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}

func printDeadRows(w io.Writer, rows []inspect.DeadLetterRow, empty string) error {
	if len(rows) == 0 {
		fmt.Fprintln(w, empty)
		return nil
	}
	t := newTable(w)
	t.row("ID", "STATUS", "GROUP", "TOPIC", "EVENT ID", "TYPE", "KEY", "CLASS", "PARKED", "FIRST SEEN", "REPLAYED", "ERROR")
	for _, r := range rows {
		t.row(strconv.FormatInt(r.ID, 10), r.Status, r.ConsumerGroup, r.Topic, r.EventID, r.EventType, r.BusinessKey, r.ErrorClass,
			strconv.Itoa(r.ParkCount)+"x", ts(r.FirstSeenAt), strconv.Itoa(r.ReplayCount)+"x", r.ErrorText)
	}
	return t.flush()
}

func printDeadList(w io.Writer, rows []inspect.DeadLetterRow) error {
	if err := printDeadRows(w, rows, "no dead letters"); err != nil {
		return err
	}
	if len(rows) > 0 {
		fmt.Fprintf(w, "%d dead letter(s)\n", len(rows))
	}
	return nil
}

func printDeadLetter(w io.Writer, d inspect.DeadLetterRow) error {
	t := newTable(w)
	t.row("id", strconv.FormatInt(d.ID, 10))
	t.row("status", d.Status)
	t.row("consumer group", d.ConsumerGroup)
	t.row("topic / queue / offset", fmt.Sprintf("%s / %d / %d", d.Topic, d.QueueID, d.QueueOffset))
	t.row("msg id", d.MsgID)
	t.row("event id", d.EventID)
	t.row("event type", d.EventType)
	t.row("business key", d.BusinessKey)
	t.row("error class", d.ErrorClass)
	t.row("error", d.ErrorText)
	t.row("payload", d.Payload)
	t.row("payload redacted when parked", strconv.FormatBool(d.PayloadRedacted))
	t.row("request hash", d.RequestHash)
	t.row("existing hash", str(d.ExistingHash))
	t.row("reconsume times", strconv.Itoa(d.ReconsumeTimes))
	t.row("parked", fmt.Sprintf("%dx, first %s, last %s", d.ParkCount, ts(d.FirstSeenAt), ts(d.LastSeenAt)))
	t.row("replayed", fmt.Sprintf("%dx, last %s", d.ReplayCount, tsp(d.ReplayedAt)))
	t.row("resolved", tsp(d.ResolvedAt)+" "+str(d.ResolutionNote))
	keys := make([]string, 0, len(d.Properties))
	for k := range d.Properties {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t.row("property "+k, d.Properties[k])
	}
	return t.flush()
}

func printStuck(w io.Writer, rows []inspect.StuckRow, missing []string, older time.Duration) error {
	if len(rows) == 0 {
		fmt.Fprintf(w, "nothing stuck for more than %s\n", older)
	} else {
		t := newTable(w)
		t.row("AGE", "TABLE", "STATUS", "KEY", "EVENT ID", "WHERE", "TYPE/CLASS", "TRIES", "SINCE", "DETAIL")
		for _, r := range rows {
			t.row(inspect.FormatAge(r.Age), r.Table, r.Status, r.Key, r.EventID, r.Where, r.Type, strconv.Itoa(r.Tries), ts(r.Since), r.Detail)
		}
		if err := t.flush(); err != nil {
			return err
		}
		fmt.Fprintf(w, "%d stuck row(s) older than %s\n", len(rows), older)
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "missing tables: %s\n", strings.Join(missing, ", "))
	}
	return nil
}

func printStats(w io.Writer, rows []inspect.StatRow, missing []string) error {
	if len(rows) == 0 {
		fmt.Fprintln(w, "no rows")
	} else {
		t := newTable(w)
		t.row("TABLE", "GROUP/DESTINATION", "STATUS", "COUNT", "OLDEST")
		for _, r := range rows {
			t.row(r.Table, r.Where, r.Status, strconv.FormatInt(r.Count, 10), tsp(r.Oldest))
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		fmt.Fprintf(w, "missing tables: %s\n", strings.Join(missing, ", "))
	}
	return nil
}

func printPlan(w io.Writer, p replay.Plan) error {
	fmt.Fprintln(w, "DRY RUN: nothing sent")
	if len(p.Candidates) == 0 {
		fmt.Fprintln(w, "no parked dead letter matches")
		return nil
	}
	t := newTable(w)
	t.row("ID", "ACTION", "GROUP", "TOPIC", "EVENT ID", "TYPE", "KEY", "CLASS", "FIRST SEEN", "REPLAYED", "WHY SKIPPED")
	for _, c := range p.Candidates {
		t.row(strconv.FormatInt(c.DeadLetterID, 10), c.Action, c.ConsumerGroup, c.Topic, c.EventID, c.EventType, c.BusinessKey,
			c.ErrorClass, ts(c.FirstSeenAt), strconv.Itoa(c.ReplayCount)+"x", c.SkipReason)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "would replay %d, skip %d\n", p.Replay, p.Skip)
	return nil
}

func printReplay(w io.Writer, r replay.Report) error {
	t := newTable(w)
	t.row("ID", "RESULT", "GROUP", "TOPIC", "EVENT ID", "MSG ID", "DETAIL")
	for _, it := range r.Items {
		t.row(strconv.FormatInt(it.DeadLetterID, 10), it.Result, it.ConsumerGroup, it.Topic, it.EventID, it.MsgID, it.Detail)
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "audit %d: %s; selected %d, sent %d, failed %d, skipped %d, new dead letters %d (rate %g/s, batch %d)\n",
		r.AuditID, r.Result, r.Selected, r.Sent, r.Failed, r.Skipped, r.NewDeadLetters, r.Rate, r.Batch)
	return nil
}

func printArchive(w io.Writer, r archive.Report) error {
	if r.DryRun {
		fmt.Fprintln(w, "DRY RUN: nothing removed")
	}
	t := newTable(w)
	t.row("TABLE", "RULE", "RETENTION", "CUTOFF", "ELIGIBLE", "REMOVED", "MOVED", "BATCHES")
	for _, x := range r.Rules {
		if x.Missing {
			t.row(x.Table, x.Rule, x.Retention.String(), ts(x.Cutoff), "table missing", "-", "-", "-")
			continue
		}
		t.row(x.Table, x.Rule, x.Retention.String(), ts(x.Cutoff), strconv.FormatInt(x.Eligible, 10),
			strconv.FormatInt(x.Removed, 10), strconv.FormatInt(x.Moved, 10), strconv.Itoa(x.Batches))
	}
	return t.flush()
}
