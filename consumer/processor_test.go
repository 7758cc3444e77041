package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

func newProc(t *testing.T, db *sqlx.DB, mut func(c *ProcessorConfig)) *Processor {
	t.Helper()
	c := ProcessorConfig{Group: testenv.Name(t, "g"), DB: db, Routes: map[string]Route{
		"Created": {Handler: effectHandler},
		"Moved":   {Handler: effectHandler},
	}}
	if mut != nil {
		mut(&c)
	}
	p, err := NewProcessor(c)
	require.NoError(t, err)
	return p
}

func TestProcessDedupAndConflict(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessDedupAndConflict)
}

func testProcessDedupAndConflict(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, nil)
	ctx := context.Background()
	id := wire.NewEventID()

	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`)).Result)
	for range 3 {
		o := p.Process(ctx, msg(ev(id, "Created"), `{"a":1}`))
		require.Equal(t, ResultDuplicate, o.Result)
		require.True(t, o.Ack())
	}
	c := p.Process(ctx, msg(ev(id, "Created"), `{"a":2}`))
	require.Equal(t, ResultConflict, c.Result)
	require.True(t, c.Ack())
	require.ErrorIs(t, c.Err, ErrConflict)
	require.Equal(t, 1, effects(t, db), "the conflicting payload never runs")

	dl, err := p.DeadLetters().Get(ctx, c.DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, ClassConflict, dl.ErrorClass)
	require.Equal(t, wire.Hash([]byte(`{"a":2}`)), dl.RequestHash)
	require.Equal(t, wire.Hash([]byte(`{"a":1}`)), dl.ExistingHash)
	require.Equal(t, DeadLetterParked, dl.Status)
	require.Equal(t, id, dl.Properties[wire.PropEventID], "properties keep the original id for a replay")

	// The same conflicting message again updates the same dead letter.
	c2 := p.Process(ctx, msg(ev(id, "Created"), `{"a":2}`))
	require.Equal(t, c.DeadLetterID, c2.DeadLetterID)
	dl, err = p.DeadLetters().Get(ctx, c.DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, 2, dl.ParkCount)

	s := p.Stats()
	require.Equal(t, Stats{Applied: 1, Duplicates: 3, Conflicts: 2, Parked: 2}, s)
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE status = 'SUCCESS'"))
}

func TestProcessConcurrentDeliveriesOneEffect(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessConcurrentDeliveriesOneEffect)
}

func testProcessConcurrentDeliveriesOneEffect(t *testing.T, db *sqlx.DB) {
	// Two processors of the same group stand for two instances.
	p1 := newProc(t, db, nil)
	cfg := p1.Config()
	p2, err := NewProcessor(cfg)
	require.NoError(t, err)
	ctx := context.Background()
	const events, copies = 30, 6
	var wg sync.WaitGroup
	for i := range events {
		id := wire.NewEventID()
		for c := range copies {
			p := p1
			if c%2 == 1 {
				p = p2
			}
			wg.Go(func() {
				o := p.Process(ctx, msg(ev(id, "Created"), fmt.Sprintf("payload-%d", i)))
				if o.Result != ResultApplied && o.Result != ResultDuplicate {
					t.Errorf("event %s: %s %v", id, o.Result, o.Err)
				}
			})
		}
	}
	wg.Wait()
	require.Equal(t, events, effects(t, db))
	s1, s2 := p1.Stats(), p2.Stats()
	require.EqualValues(t, events, s1.Applied+s2.Applied)
	require.EqualValues(t, events*(copies-1), s1.Duplicates+s2.Duplicates)
}

func TestProcessHandlerErrorLeavesNoDedupRow(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessHandlerErrorLeavesNoDedupRow)
}

func testProcessHandlerErrorLeavesNoDedupRow(t *testing.T, db *sqlx.DB) {
	fail := atomic.Bool{}
	fail.Store(true)
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Routes["Created"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			if err := effectHandler(ctx, tx, ev); err != nil {
				return err
			}
			if fail.Load() {
				return errors.New("downstream said no") // unclassified: unknown
			}
			return nil
		}}
	})
	ctx := context.Background()
	id := wire.NewEventID()
	m := msg(ev(id, "Created"), "x")
	o := p.Process(ctx, m)
	require.Equal(t, ResultRetry, o.Result)
	require.False(t, o.Ack())
	require.Equal(t, ClassUnknown, o.Class)
	require.Equal(t, 1, o.Attempt)
	require.Equal(t, 1, o.DelayLevel)
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE event_id = ?", id), "no dedup row after a rollback")
	require.Equal(t, 0, effects(t, db), "the handler's write rolled back with it")
	require.Equal(t, 1, countRows(t, db, "SELECT attempts FROM rmqtx_consume_attempt WHERE event_id = ?", id))

	fail.Store(false)
	m.Delivery.ReconsumeTimes = 1
	require.Equal(t, ResultApplied, p.Process(ctx, m).Result)
	require.Equal(t, 1, effects(t, db))
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE event_id = ?", id), "attempts cleared on success")
}

func TestProcessRetryLimitParks(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessRetryLimitParks)
}

func testProcessRetryLimitParks(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.MaxRetries = 2
		c.MaxWaits = 1
		c.Routes["Created"] = Route{Handler: func(context.Context, *sqlx.Tx, Event) error {
			return Transient(errors.New("db of partner down"))
		}}
		c.Routes["Waiting"] = Route{Handler: func(context.Context, *sqlx.Tx, Event) error {
			return Wait(errors.New("order not paid yet"))
		}}
	})
	ctx := context.Background()
	id := wire.NewEventID()
	m := msg(ev(id, "Created"), "x")
	for i := 1; i <= 2; i++ {
		o := p.Process(ctx, m)
		require.Equal(t, ResultRetry, o.Result)
		require.Equal(t, i, o.Attempt)
		require.Equal(t, ClassTransient, o.Class)
		m.Delivery.ReconsumeTimes++
	}
	o := p.Process(ctx, m)
	require.Equal(t, ResultParked, o.Result)
	require.ErrorIs(t, o.Err, ErrRetryLimit)
	require.Equal(t, ClassTransient, o.Class)
	dl, err := p.DeadLetters().Get(ctx, o.DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, ClassTransient, dl.ErrorClass)
	require.Contains(t, dl.ErrorText, "db of partner down")
	require.Equal(t, 2, dl.ReconsumeTimes)
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE event_id = ?", id))

	w := msg(ev(wire.NewEventID(), "Waiting"), "y")
	require.Equal(t, ResultRetry, p.Process(ctx, w).Result)
	ow := p.Process(ctx, w)
	require.Equal(t, ResultParked, ow.Result)
	require.Equal(t, ClassWait, ow.Class)
	require.Equal(t, 0, effects(t, db))
}

func TestProcessPermanentFailures(t *testing.T) {
	t.Parallel()
	eachDB(t, testProcessPermanentFailures)
}

func testProcessPermanentFailures(t *testing.T, db *sqlx.DB) {
	var handlerRuns atomic.Int32
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Routes["Rejected"] = Route{Handler: func(context.Context, *sqlx.Tx, Event) error {
			handlerRuns.Add(1)
			return Permanent(errors.New("amount is negative"))
		}}
		c.Routes["JSON"] = Route{
			Validate: func(ev Event) error {
				var v map[string]any
				return json.Unmarshal(ev.Payload, &v)
			},
			Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
				handlerRuns.Add(1)
				return effectHandler(ctx, tx, ev)
			},
		}
		c.Routes["Panics"] = Route{Handler: func(context.Context, *sqlx.Tx, Event) error { panic("bug") }}
	})
	ctx := context.Background()

	o := p.Process(ctx, msg(ev(wire.NewEventID(), "Rejected"), "x"))
	require.Equal(t, ResultParked, o.Result)
	require.Equal(t, ClassPermanent, o.Class)

	o = p.Process(ctx, msg(ev(wire.NewEventID(), "JSON"), "{not json"))
	require.Equal(t, ResultParked, o.Result)
	require.Equal(t, ClassData, o.Class)
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(wire.NewEventID(), "JSON"), `{"ok":true}`)).Result)

	o = p.Process(ctx, msg(ev(wire.NewEventID(), "NoSuchType"), "x"))
	require.Equal(t, ResultParked, o.Result)
	require.ErrorIs(t, o.Err, ErrUnknownEventType)

	// A message without an rmqtx envelope.
	raw := Message{Body: []byte("raw"), Properties: map[string]string{"KEYS": "k"}, Delivery: Delivery{Topic: "t", MsgID: "MSG1"}}
	o = p.Process(ctx, raw)
	require.Equal(t, ResultParked, o.Result)
	require.ErrorIs(t, o.Err, ErrMalformed)
	require.Equal(t, "msgid:MSG1", o.EventID)

	// A payload that does not match its declared hash.
	bad := msg(ev(wire.NewEventID(), "JSON"), `{"ok":true}`)
	bad.Body = []byte(`{"ok":false}`)
	o = p.Process(ctx, bad)
	require.Equal(t, ResultParked, o.Result)
	require.Equal(t, ClassData, o.Class)

	o = p.Process(ctx, msg(ev(wire.NewEventID(), "Panics"), "x"))
	require.Equal(t, ResultRetry, o.Result)
	require.ErrorIs(t, o.Err, ErrHandlerPanic)

	require.EqualValues(t, 2, handlerRuns.Load(), "the rejected one ran once, the valid JSON once, the invalid JSON never")
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_attempt WHERE last_class <> 'unknown'"), "parked at once, no attempts")
	n, err := p.DeadLetters().Count(ctx, p.Config().Group, DeadLetterParked)
	require.NoError(t, err)
	require.Equal(t, 5, n)

	ign := newProc(t, db, func(c *ProcessorConfig) { c.UnknownType = UnknownIgnore })
	require.Equal(t, ResultIgnored, ign.Process(ctx, msg(ev(wire.NewEventID(), "NoSuchType"), "x")).Result)
}

func TestVersionGuardStrict(t *testing.T) {
	t.Parallel()
	eachDB(t, testVersionGuardStrict)
}

func testVersionGuardStrict(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, nil) // strict is the default
	ctx := context.Background()
	agg := "box-1"
	ids := []string{"", wire.NewEventID(), wire.NewEventID(), wire.NewEventID()}

	gap := p.Process(ctx, msg(aggEv(ids[2], agg, 2), "v2"))
	require.Equal(t, ResultRetry, gap.Result)
	require.Equal(t, ClassWait, gap.Class)
	require.ErrorIs(t, gap.Err, ErrVersionGap)
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log"), "a gap leaves no dedup row")

	require.Equal(t, ResultApplied, p.Process(ctx, msg(aggEv(ids[1], agg, 1), "v1")).Result)
	m2 := msg(aggEv(ids[2], agg, 2), "v2")
	m2.Delivery.ReconsumeTimes = 1
	require.Equal(t, ResultApplied, p.Process(ctx, m2).Result)
	require.Equal(t, ResultDuplicate, p.Process(ctx, m2).Result)

	// A different event carrying an old version is stale; a jump is a gap.
	st := p.Process(ctx, msg(aggEv(wire.NewEventID(), agg, 1), "old"))
	require.Equal(t, ResultStale, st.Result)
	require.True(t, st.Ack())
	require.Equal(t, ResultRetry, p.Process(ctx, msg(aggEv(wire.NewEventID(), agg, 4), "v4")).Result)
	require.Equal(t, 2, countRows(t, db, "SELECT last_applied_version FROM rmqtx_aggregate_version WHERE aggregate_id = ?", agg))
	require.Equal(t, 2, effects(t, db))
	s := p.Stats()
	require.EqualValues(t, 2, s.Gaps)
	require.EqualValues(t, 1, s.Stale)
}

func TestVersionGuardMonotonic(t *testing.T) {
	t.Parallel()
	eachDB(t, testVersionGuardMonotonic)
}

func testVersionGuardMonotonic(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.VersionMode = VersionMonotonic
		c.Routes["Unversioned"] = Route{Handler: effectHandler, Version: VersionNone}
	})
	ctx := context.Background()
	agg := "box-9"
	require.Equal(t, ResultApplied, p.Process(ctx, msg(aggEv(wire.NewEventID(), agg, 3), "v3")).Result)
	staleID := wire.NewEventID()
	require.Equal(t, ResultStale, p.Process(ctx, msg(aggEv(staleID, agg, 1), "v1")).Result)
	require.Equal(t, ResultDuplicate, p.Process(ctx, msg(aggEv(staleID, agg, 1), "v1")).Result, "a stale skip is recorded: its duplicate is a dedup hit")
	require.Equal(t, ResultApplied, p.Process(ctx, msg(aggEv(wire.NewEventID(), agg, 7), "v7")).Result)
	require.Equal(t, ResultStale, p.Process(ctx, msg(aggEv(wire.NewEventID(), agg, 7), "v7 again")).Result)
	require.Equal(t, 7, countRows(t, db, "SELECT last_applied_version FROM rmqtx_aggregate_version WHERE aggregate_id = ?", agg))
	require.Equal(t, 1, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE status = 'STALE' AND event_id = ?", staleID))

	// A route with VersionNone ignores versions altogether.
	e := aggEv(wire.NewEventID(), agg, 1)
	e.EventType = "Unversioned"
	require.Equal(t, ResultApplied, p.Process(ctx, msg(e, "any")).Result)
	require.Equal(t, 3, effects(t, db))
}

func TestRedactionAndResultRef(t *testing.T) {
	t.Parallel()
	eachDB(t, testRedactionAndResultRef)
}

func testRedactionAndResultRef(t *testing.T, db *sqlx.DB) {
	var leaked Event
	var validateErr error
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Redact = func([]byte) []byte { return []byte("<redacted>") }
		c.RedactText = func(s string) string { return strings.ReplaceAll(s, "4111-1111", "****") }
		c.Routes["Card"] = Route{Handler: func(context.Context, *sqlx.Tx, Event) error {
			return Permanent(errors.New("card 4111-1111 declined"))
		}}
		c.Routes["Created"] = Route{
			Validate: func(ev Event) error {
				validateErr = ev.SetResultRef("from validate") // not a handler's Event
				return nil
			},
			Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
				leaked = ev
				if err := ev.SetResultRef("first"); err != nil {
					return err
				}
				if err := ev.SetResultRef("order:42"); err != nil { // the last one wins
					return err
				}
				return effectHandler(ctx, tx, ev)
			},
		}
		c.Routes["Legacy"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			SetResultRef(ctx, "legacy:7") // deprecated, still records
			return effectHandler(ctx, tx, ev)
		}}
		c.Routes["Long"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			if err := ev.SetResultRef(strings.Repeat("é", 300)); err != nil {
				return err
			}
			return effectHandler(ctx, tx, ev)
		}}
		c.Routes["RolledBack"] = Route{Handler: func(ctx context.Context, tx *sqlx.Tx, ev Event) error {
			if err := ev.SetResultRef("never"); err != nil {
				return err
			}
			return Permanent(errors.New("refused after setting a ref"))
		}}
	})
	ctx := context.Background()
	o := p.Process(ctx, msg(ev(wire.NewEventID(), "Card"), `{"pan":"4111-1111"}`))
	require.Equal(t, ResultParked, o.Result)
	dl, err := p.DeadLetters().Get(ctx, o.DeadLetterID)
	require.NoError(t, err)
	require.Equal(t, "<redacted>", string(dl.Payload))
	require.True(t, dl.PayloadRedacted)
	require.False(t, dl.Replayable(), "a redacted payload is not the original")
	require.NotContains(t, dl.ErrorText, "4111")
	require.Contains(t, dl.ErrorText, "card **** declined")

	id := wire.NewEventID()
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(id, "Created"), "x")).Result)
	var ref string
	require.NoError(t, db.Get(&ref, db.Rebind("SELECT result_ref FROM rmqtx_consume_log WHERE event_id = ?"), id))
	require.Equal(t, "order:42", ref)

	// Outside a handler SetResultRef fails and records nothing: in Validate,
	// on the handler's Event once the handler returned, on an Event built by
	// hand; the deprecated context form does nothing with another context.
	require.ErrorIs(t, validateErr, ErrNotInHandler)
	require.Equal(t, id, leaked.ID)
	require.ErrorIs(t, leaked.SetResultRef("too late"), ErrNotInHandler)
	require.ErrorIs(t, Event{ID: "x"}.SetResultRef("r"), ErrNotInHandler)
	SetResultRef(ctx, "nowhere")
	require.NoError(t, db.Get(&ref, db.Rebind("SELECT result_ref FROM rmqtx_consume_log WHERE event_id = ?"), id))
	require.Equal(t, "order:42", ref, "a call after the handler returned changes nothing")

	legacy := wire.NewEventID()
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(legacy, "Legacy"), "x")).Result)
	require.NoError(t, db.Get(&ref, db.Rebind("SELECT result_ref FROM rmqtx_consume_log WHERE event_id = ?"), legacy))
	require.Equal(t, "legacy:7", ref)

	// Truncated to the column's 255 characters, never mid-character.
	long := wire.NewEventID()
	require.Equal(t, ResultApplied, p.Process(ctx, msg(ev(long, "Long"), "x")).Result)
	require.NoError(t, db.Get(&ref, db.Rebind("SELECT result_ref FROM rmqtx_consume_log WHERE event_id = ?"), long))
	require.Equal(t, strings.Repeat("é", 255), ref)

	// A handler that fails leaves no dedup row, so no reference either.
	rb := wire.NewEventID()
	require.Equal(t, ResultParked, p.Process(ctx, msg(ev(rb, "RolledBack"), "x")).Result)
	require.Equal(t, 0, countRows(t, db, "SELECT COUNT(*) FROM rmqtx_consume_log WHERE event_id = ?", rb))
}

func TestDeadLetterStore(t *testing.T) {
	t.Parallel()
	eachDB(t, testDeadLetterStore)
}

func testDeadLetterStore(t *testing.T, db *sqlx.DB) {
	p := newProc(t, db, func(c *ProcessorConfig) {
		c.Routes["Rejected"] = Route{Handler: func(context.Context, *sqlx.Tx, Event) error {
			return Permanent(errors.New("no"))
		}}
	})
	ctx := context.Background()
	var msgs []Message
	for i := range 3 {
		e := ev(wire.NewEventID(), "Rejected")
		e.BusinessKey = fmt.Sprintf("order-%d", i)
		msgs = append(msgs, msg(e, "x"))
		require.Equal(t, ResultParked, p.Process(ctx, msgs[i]).Result)
	}
	s, err := NewDeadLetterStore(db, "")
	require.NoError(t, err)
	all, err := s.List(ctx, DeadLetterFilter{ConsumerGroup: p.Config().Group})
	require.NoError(t, err)
	require.Len(t, all, 3)
	require.Equal(t, "t", all[0].Topic)
	require.False(t, all[0].FirstSeenAt.IsZero())
	one, err := s.List(ctx, DeadLetterFilter{BusinessKey: "order-1", Status: DeadLetterParked})
	require.NoError(t, err)
	require.Len(t, one, 1)
	page, err := s.List(ctx, DeadLetterFilter{AfterID: all[0].ID, Limit: 1})
	require.NoError(t, err)
	require.Len(t, page, 1)
	require.Equal(t, all[1].ID, page[0].ID)

	require.NoError(t, s.MarkReplayed(ctx, all[0].ID, "fixed the rule; ticket OPS-1"))
	require.ErrorIs(t, s.MarkReplayed(ctx, all[0].ID, "again"), ErrNotParked)
	require.NoError(t, s.MarkDiscarded(ctx, all[1].ID, "test data"))
	_, err = s.Get(ctx, 999999)
	require.ErrorIs(t, err, ErrNotFound)
	require.ErrorIs(t, s.MarkDiscarded(ctx, 999999, ""), ErrNotFound)

	// The replayed message fails again: PARKED again. The discarded one stays discarded.
	require.Equal(t, ResultParked, p.Process(ctx, msgs[0]).Result)
	require.Equal(t, ResultParked, p.Process(ctx, msgs[1]).Result)
	r, err := s.Get(ctx, all[0].ID)
	require.NoError(t, err)
	require.Equal(t, DeadLetterParked, r.Status)
	require.Equal(t, 1, r.ReplayCount)
	require.NotNil(t, r.ReplayedAt)
	require.Equal(t, 2, r.ParkCount)
	d, err := s.Get(ctx, all[1].ID)
	require.NoError(t, err)
	require.Equal(t, DeadLetterDiscarded, d.Status)
	require.Equal(t, "test data", d.ResolutionNote)
	require.Equal(t, 2, d.ParkCount)
}

func TestMigrateIdempotentWithPrefix(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testMigrateIdempotentWithPrefix)
}

func testMigrateIdempotentWithPrefix(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	ctx := context.Background()
	for range 2 {
		require.NoError(t, migrateTables(ctx, db, "svc_a_"))
	}
	require.Equal(t, 2, countRows(t, db, "SELECT COUNT(*) FROM svc_a_schema_migrations WHERE part = 'consumer'"), "steps 1 and 2, once each")
	schema := "DATABASE()"
	if db.DriverName() != "mysql" {
		schema = "current_schema()"
	}
	require.Equal(t, 6, countRows(t, db, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = "+schema+" AND table_name LIKE 'svc\\_a\\_%'"),
		"the five consumer tables and the version table")
	require.ErrorIs(t, migrateTables(ctx, db, "bad prefix"), ErrConfig)
}
