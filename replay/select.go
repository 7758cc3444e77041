package replay

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqltime"
	"github.com/rmqtx/rmqtx/wire"
)

// Selector picks dead letters. Zero fields do not filter; every set field
// must match. Only PARKED dead letters are selected (plus REPLAYED ones with
// IncludeReplayed); DISCARDED ones never are.
type Selector struct {
	IDs           []int64   `json:"ids,omitempty"`            // dead_letter.id
	ConsumerGroup string    `json:"consumer_group,omitempty"` // the group that parked it
	Topic         string    `json:"topic,omitempty"`          // original topic
	EventType     string    `json:"event_type,omitempty"`
	BusinessKey   string    `json:"business_key,omitempty"`
	ErrorClass    string    `json:"error_class,omitempty"` // consumer.Class: transient, wait, permanent, data, conflict, unknown
	Since         time.Time `json:"since,omitzero"`        // first parked at or after (UTC)
	Until         time.Time `json:"until,omitzero"`        // first parked before (UTC)
	// IncludeReplayed also selects dead letters already REPLAYED, to send them
	// again (the consumer's dedup absorbs what was applied).
	IncludeReplayed bool `json:"include_replayed,omitempty"`
	// Limit caps the selection (oldest id first). Default Config.MaxMessages.
	Limit int `json:"limit,omitempty"`
}

// Empty reports whether s selects every dead letter; Replay refuses an empty
// selector so that "everything" is always a deliberate choice (set a Since).
func (s Selector) Empty() bool {
	return len(s.IDs) == 0 && s.ConsumerGroup == "" && s.Topic == "" && s.EventType == "" &&
		s.BusinessKey == "" && s.ErrorClass == "" && s.Since.IsZero() && s.Until.IsZero()
}

// statuses are the dead-letter statuses s selects.
func (s Selector) statuses() []string {
	if s.IncludeReplayed {
		return []string{consumer.DeadLetterParked, consumer.DeadLetterReplayed}
	}
	return []string{consumer.DeadLetterParked}
}

// filter is s as the consumer's dead-letter filter; limit applies when s has
// no Limit.
func (s Selector) filter(limit int) consumer.DeadLetterFilter {
	if s.Limit > 0 {
		limit = s.Limit
	}
	return consumer.DeadLetterFilter{IDs: s.IDs, ConsumerGroup: s.ConsumerGroup, Topic: s.Topic, EventType: s.EventType,
		BusinessKey: s.BusinessKey, ErrorClass: consumer.Class(s.ErrorClass), Since: s.Since, Until: s.Until,
		Statuses: s.statuses(), Limit: limit}
}

// Candidate is one selected dead letter and what a replay does with it.
type Candidate struct {
	DeadLetterID  int64     `json:"dead_letter_id"`
	ConsumerGroup string    `json:"consumer_group"`
	Topic         string    `json:"topic"`
	EventID       string    `json:"event_id"`
	EventType     string    `json:"event_type"`
	BusinessKey   string    `json:"business_key"`
	ErrorClass    string    `json:"error_class"`
	Status        string    `json:"status"`
	ReplayCount   int       `json:"replay_count"`
	FirstSeenAt   time.Time `json:"first_seen_at"`
	// Action is "replay", or "skip" with SkipReason.
	Action     string `json:"action"`
	SkipReason string `json:"skip_reason,omitempty"`
}

// Plan is the result of DryRun.
type Plan struct {
	Selector   Selector    `json:"selector"`
	Candidates []Candidate `json:"candidates"`
	Replay     int         `json:"replay"` // candidates that would be sent
	Skip       int         `json:"skip"`
}

// candidateColumns are what selectCandidates reads; hash_ok compares the
// stored payload with the stored hash on the database.
func candidateColumns(d dialect.Dialect) string {
	return "id, consumer_group, topic, event_id, event_type, business_key, error_class, status," +
		" replay_count, first_seen_at, payload IS NULL AS no_payload, payload_redacted," +
		" (payload IS NOT NULL AND request_hash = " + d.SHA256Hex("payload") + ") AS hash_ok"
}

type candidateRow struct {
	ID            int64        `db:"id"`
	ConsumerGroup string       `db:"consumer_group"`
	Topic         string       `db:"topic"`
	EventID       string       `db:"event_id"`
	EventType     string       `db:"event_type"`
	BusinessKey   string       `db:"business_key"`
	ErrorClass    string       `db:"error_class"`
	Status        string       `db:"status"`
	ReplayCount   int          `db:"replay_count"`
	FirstSeenAt   sqltime.Time `db:"first_seen_at"`
	NoPayload     bool         `db:"no_payload"`
	Redacted      bool         `db:"payload_redacted"`
	HashOK        sql.NullBool `db:"hash_ok"`
}

func (r candidateRow) candidate() Candidate {
	c := Candidate{
		DeadLetterID: r.ID, ConsumerGroup: r.ConsumerGroup, Topic: r.Topic, EventID: r.EventID,
		EventType: r.EventType, BusinessKey: r.BusinessKey, ErrorClass: r.ErrorClass, Status: r.Status,
		ReplayCount: r.ReplayCount, FirstSeenAt: r.FirstSeenAt.Time, Action: "replay",
	}
	c.SkipReason = skipReason(r.ErrorClass, r.NoPayload, !r.Redacted || r.HashOK.Bool)
	if c.SkipReason != "" {
		c.Action = "skip"
	}
	return c
}

// skipReason says why a dead letter cannot be replayed, or "". replayable is
// consumer.DeadLetter.Replayable: the stored payload is the delivered one.
func skipReason(class string, noPayload, replayable bool) string {
	switch {
	case noPayload:
		return "no payload stored"
	case !replayable:
		return "payload was redacted when parked"
	case class == string(consumer.ClassConflict):
		return "payload-hash conflict: the consumer would park it again"
	}
	return ""
}

func (r *Replayer) selectCandidates(ctx context.Context, s Selector) ([]Candidate, error) {
	q, args := r.dead.SelectSQL(candidateColumns(r.d), s.filter(r.cfg.MaxMessages))
	var rows []candidateRow
	if err := r.cfg.DB.SelectContext(ctx, &rows, q, args...); err != nil {
		return nil, fmt.Errorf("replay: select dead letters: %w", err)
	}
	out := make([]Candidate, len(rows))
	for i, row := range rows {
		out[i] = row.candidate()
	}
	return out, nil
}

// DryRun returns what Replay would do with s: the selected dead letters and,
// for each, whether it would be sent or skipped (and why). It sends and
// writes nothing, and works without Start.
func (r *Replayer) DryRun(ctx context.Context, s Selector) (Plan, error) {
	cs, err := r.selectCandidates(ctx, s)
	if err != nil {
		return Plan{}, err
	}
	p := Plan{Selector: s, Candidates: cs}
	for _, c := range cs {
		if c.Action == "replay" {
			p.Replay++
		} else {
			p.Skip++
		}
	}
	return p, nil
}

// lockedSkipReason says why a dead letter read under its row lock cannot be
// replayed now (its status changed since the selection, or its payload), or "".
func lockedSkipReason(d consumer.DeadLetter, s Selector) string {
	if !slices.Contains(s.statuses(), d.Status) {
		return "status is now " + d.Status
	}
	return skipReason(string(d.ErrorClass), d.Payload == nil, d.Replayable())
}

// replayProperties are the stored message properties without a previous
// replay's metadata (it is replaced, not stacked).
func replayProperties(d consumer.DeadLetter) map[string]string {
	props := make(map[string]string, len(d.Properties))
	for k, v := range d.Properties {
		if !strings.HasPrefix(k, wire.PropReplayPrefix) {
			props[k] = v
		}
	}
	return props
}

func randHex(n int) string {
	b := make([]byte, (n+1)/2)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)[:n]
}
