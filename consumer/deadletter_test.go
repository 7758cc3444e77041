package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/wire"
)

// The one dead-letter filter renders every field as a bound condition, in a
// fixed order, and SelectSQL wraps it with the columns, the order and the
// limit (default 100, not capped).
func TestDeadLetterFilterSQL(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2025, 6, 1, 12, 0, 0, 0, time.FixedZone("CEST", 2*3600))
	s := &DeadLetterStore{t: tables{dead: "rmqtx_dead_letter"}, d: dialect.MySQL}
	cases := map[string]struct {
		f     DeadLetterFilter
		where string
		args  []any
	}{
		"empty": {DeadLetterFilter{}, "", nil},
		"fields": {DeadLetterFilter{ConsumerGroup: "g", Topic: "t", EventID: "e", Status: "PARKED", EventType: "T",
			BusinessKey: "k", ErrorClass: ClassData},
			" WHERE consumer_group = ? AND topic = ? AND event_id = ? AND status = ? AND event_type = ? AND business_key = ? AND error_class = ?",
			[]any{"g", "t", "e", "PARKED", "T", "k", "data"}},
		"lists": {DeadLetterFilter{IDs: []int64{3, 1}, Statuses: []string{DeadLetterParked, DeadLetterReplayed}},
			" WHERE id IN (?, ?) AND status IN (?, ?)", []any{int64(3), int64(1), "PARKED", "REPLAYED"}},
		"times in UTC": {DeadLetterFilter{Since: t0, Until: t0.Add(time.Hour), NotAfter: t0.Add(2 * time.Hour), LastSeenSince: t0.Add(3 * time.Hour)},
			" WHERE first_seen_at >= ? AND first_seen_at < ? AND first_seen_at <= ? AND last_seen_at >= ?",
			[]any{t0.UTC(), t0.Add(time.Hour).UTC(), t0.Add(2 * time.Hour).UTC(), t0.Add(3 * time.Hour).UTC()}},
		"page": {DeadLetterFilter{AfterID: 7, Limit: 5000}, " WHERE id > ?", []any{int64(7)}},
	}
	for name, c := range cases {
		where, args := c.f.where()
		require.Equal(t, c.where, where, name)
		require.Equal(t, c.args, args, name)
		for _, a := range args {
			if tm, ok := a.(time.Time); ok {
				require.Equal(t, time.UTC, tm.Location(), "%s: times are bound in UTC", name)
			}
		}
	}
	q, args := s.SelectSQL("id, status", DeadLetterFilter{ConsumerGroup: "g"})
	require.Equal(t, "SELECT id, status FROM rmqtx_dead_letter WHERE consumer_group = ? ORDER BY id LIMIT ?", q)
	require.Equal(t, []any{"g", DefaultDeadLetterLimit}, args)
	q, args = s.SelectSQL("", DeadLetterFilter{Limit: 5000})
	require.Equal(t, "SELECT "+deadLetterColumns+" FROM rmqtx_dead_letter ORDER BY id LIMIT ?", q)
	require.Equal(t, []any{5000}, args, "SelectSQL does not cap the limit")
}

// insertDL writes a dead letter straight into the table.
func insertDL(t *testing.T, db *sqlx.DB, group, topic, eventID, status string, class Class, firstSeen, lastSeen time.Time) int64 {
	t.Helper()
	d := dialect.Must(db)
	id, err := d.InsertID(context.Background(), db, d.Rebind(`INSERT INTO rmqtx_dead_letter (consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type,
		business_key, error_class, error_text, payload, request_hash, properties, reconsume_times, status, first_seen_at, last_seen_at)
		VALUES (?, ?, 0, 0, 'm', ?, 'T', 'k', ?, 'no', ?, ?, '{"A":"1"}', 0, ?, ?, ?)`), "id",
		group, topic, eventID, string(class), []byte("p"), wire.Hash([]byte("p")), status, firstSeen, lastSeen)
	require.NoError(t, err)
	return id
}

// Every filter field selects the rows it names in the real table; List caps
// the limit, CountFilter ignores it; time bounds are [Since, Until) and
// NotAfter inclusive.
func TestDeadLetterFilterSelects(t *testing.T) {
	t.Parallel()
	eachDB(t, testDeadLetterFilterSelects)
}

func testDeadLetterFilterSelects(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	t0 := time.Date(2025, 6, 1, 10, 0, 0, 0, time.UTC)
	a := insertDL(t, db, "g1", "orders", "e-a", DeadLetterParked, ClassPermanent, t0, t0)
	b := insertDL(t, db, "g1", "orders", "e-b", DeadLetterReplayed, ClassData, t0.Add(time.Hour), t0.Add(5*time.Hour))
	c := insertDL(t, db, "g2", "refunds", "e-c", DeadLetterDiscarded, ClassConflict, t0.Add(2*time.Hour), t0.Add(2*time.Hour))
	d := insertDL(t, db, "g2", "orders", "e-d", DeadLetterParked, ClassPermanent, t0.Add(3*time.Hour), t0.Add(6*time.Hour))
	s, err := NewDeadLetterStore(db, "")
	require.NoError(t, err)

	for name, tc := range map[string]struct {
		f    DeadLetterFilter
		want []int64
	}{
		"all":             {DeadLetterFilter{}, []int64{a, b, c, d}},
		"ids":             {DeadLetterFilter{IDs: []int64{d, a, 999999}}, []int64{a, d}},
		"topic":           {DeadLetterFilter{Topic: "refunds"}, []int64{c}},
		"event id":        {DeadLetterFilter{EventID: "e-b"}, []int64{b}},
		"statuses":        {DeadLetterFilter{Statuses: []string{DeadLetterParked, DeadLetterReplayed}}, []int64{a, b, d}},
		"status and list": {DeadLetterFilter{Status: DeadLetterParked, Statuses: []string{DeadLetterParked, DeadLetterReplayed}, ConsumerGroup: "g2"}, []int64{d}},
		"class":           {DeadLetterFilter{ErrorClass: ClassConflict}, []int64{c}},
		"since until":     {DeadLetterFilter{Since: t0.Add(time.Hour), Until: t0.Add(3 * time.Hour)}, []int64{b, c}},
		"not after":       {DeadLetterFilter{NotAfter: t0.Add(2 * time.Hour)}, []int64{a, b, c}},
		"last seen since": {DeadLetterFilter{LastSeenSince: t0.Add(5 * time.Hour)}, []int64{b, d}},
		"after id":        {DeadLetterFilter{AfterID: b, Limit: 1}, []int64{c}},
	} {
		got, err := s.List(ctx, tc.f)
		require.NoError(t, err, name)
		ids := make([]int64, len(got))
		for i, dl := range got {
			ids[i] = dl.ID
		}
		require.Equal(t, tc.want, ids, name)
		if tc.f.Limit == 0 {
			n, err := s.CountFilter(ctx, tc.f)
			require.NoError(t, err, name)
			require.Equal(t, len(tc.want), n, name)
		}
	}
	n, err := s.CountFilter(ctx, DeadLetterFilter{ConsumerGroup: "g1", Limit: 1})
	require.NoError(t, err)
	require.Equal(t, 2, n, "CountFilter ignores Limit")
	n, err = s.Count(ctx, "g2", DeadLetterParked)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	n, err = s.Count(ctx, "", "")
	require.NoError(t, err)
	require.Equal(t, 4, n)
	got, err := s.List(ctx, DeadLetterFilter{ConsumerGroup: "g1"})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"A": "1"}, got[0].Properties)
	require.Equal(t, t0, got[0].FirstSeenAt)
}

// GetForUpdate locks the row for the transaction; MarkReplayedTx records a
// replay of a PARKED or REPLAYED dead letter in it, and refuses others.
func TestDeadLetterReplayInTx(t *testing.T) {
	t.Parallel()
	eachDB(t, testDeadLetterReplayInTx)
}

func testDeadLetterReplayInTx(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	now := time.Now().UTC()
	parked := insertDL(t, db, "g", "orders", "e-1", DeadLetterParked, ClassPermanent, now, now)
	discarded := insertDL(t, db, "g", "orders", "e-2", DeadLetterDiscarded, ClassPermanent, now, now)
	s, err := NewDeadLetterStore(db, "")
	require.NoError(t, err)

	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	d, err := s.GetForUpdate(ctx, tx, parked)
	require.NoError(t, err)
	require.Equal(t, DeadLetterParked, d.Status)
	require.Equal(t, "e-1", d.EventID)

	// Another transaction cannot lock the row meanwhile.
	conn, err := db.Connx(ctx)
	require.NoError(t, err)
	defer conn.Close()
	wait := "SET SESSION innodb_lock_wait_timeout = 1"
	if db.DriverName() != "mysql" {
		wait = "SET lock_timeout = '1s'"
	}
	_, err = conn.ExecContext(ctx, wait)
	require.NoError(t, err)
	tx2, err := conn.BeginTxx(ctx, nil)
	require.NoError(t, err)
	_, err = s.GetForUpdate(ctx, tx2, parked)
	require.Error(t, err, "the row is locked by the first transaction")
	require.NotErrorIs(t, err, ErrNotFound)
	require.NoError(t, tx2.Rollback())

	require.NoError(t, s.MarkReplayedTx(ctx, tx, parked, "replayed by alice (audit 1)"))
	require.NoError(t, tx.Commit())
	d, err = s.Get(ctx, parked)
	require.NoError(t, err)
	require.Equal(t, DeadLetterReplayed, d.Status)
	require.Equal(t, 1, d.ReplayCount)
	require.NotNil(t, d.ReplayedAt)
	require.NotNil(t, d.ResolvedAt)
	require.Equal(t, "replayed by alice (audit 1)", d.ResolutionNote)

	// Sent again: a REPLAYED dead letter is accepted in a transaction (not by MarkReplayed).
	require.ErrorIs(t, s.MarkReplayed(ctx, parked, "again"), ErrNotParked)
	tx, err = db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	require.NoError(t, s.MarkReplayedTx(ctx, tx, parked, "again"))
	require.ErrorIs(t, s.MarkReplayedTx(ctx, tx, discarded, "no"), ErrNotParked)
	require.ErrorIs(t, s.MarkReplayedTx(ctx, tx, 999999, "no"), ErrNotFound)
	_, err = s.GetForUpdate(ctx, tx, 999999)
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, tx.Commit())
	d, err = s.Get(ctx, parked)
	require.NoError(t, err)
	require.Equal(t, 2, d.ReplayCount)
}

// A dead letter stores no payload unless the configuration opts out (I10):
// by default only its hash and envelope are kept, and it says so; with
// KeepPayload it stores the payload as delivered and is replayable; a hook
// that returns the payload unchanged is not counted as a redaction.
func TestDeadLetterPayloadRedactedByDefault(t *testing.T) {
	t.Parallel()
	eachDB(t, testDeadLetterPayloadRedactedByDefault)
}

func testDeadLetterPayloadRedactedByDefault(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	reject := Route{Handler: func(context.Context, *sqlx.Tx, Event) error { return Permanent(errors.New("rejected")) }}
	payload := `{"pan":"4111-1111-1111-1111"}`
	for _, c := range []struct {
		name     string
		redact   func([]byte) []byte
		stored   []byte
		redacted bool
	}{
		{"default", nil, nil, true},
		{"KeepPayload", KeepPayload, []byte(payload), false},
		{"unchanged by a hook", func(p []byte) []byte { return p }, []byte(payload), false},
		{"masked by a hook", func([]byte) []byte { return []byte(`{"pan":"****"}`) }, []byte(`{"pan":"****"}`), true},
	} {
		p := newProc(t, db, func(cfg *ProcessorConfig) {
			cfg.Redact = c.redact
			cfg.Routes["Rejected"] = reject
		})
		id := wire.NewEventID()
		o := p.Process(ctx, msg(ev(id, "Rejected"), payload))
		require.Equal(t, ResultParked, o.Result, c.name)
		dl, err := p.DeadLetters().Get(ctx, o.DeadLetterID)
		require.NoError(t, err, c.name)
		require.Equal(t, c.stored, dl.Payload, c.name)
		require.Equal(t, c.redacted, dl.PayloadRedacted, c.name)
		require.Equal(t, !c.redacted, dl.Replayable(), c.name)
		require.Equal(t, wire.Hash([]byte(payload)), dl.RequestHash, "%s: the hash identifies the payload", c.name)
		require.Equal(t, id, dl.Properties[wire.PropEventID], c.name)
		var raw []byte
		require.NoError(t, db.Get(&raw, db.Rebind("SELECT payload FROM rmqtx_dead_letter WHERE id = ?"), o.DeadLetterID))
		require.Equal(t, c.stored, raw, "%s: what the table holds", c.name)
	}
}
