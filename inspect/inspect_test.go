package inspect_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

func TestRedactors(t *testing.T) {
	t.Parallel()
	secret := []byte(`{"card":"4111111111111111","cvv":"123"}`)
	got := inspect.ShowPrefix(8)(secret)
	require.Equal(t, `{"card":… <39 bytes>`, got)
	require.NotContains(t, got, "4111")
	require.Equal(t, "<39 bytes>", inspect.Hidden()(secret))
	require.Equal(t, "***… <3 bytes>", inspect.ShowPrefix(8)([]byte("pin")), "a payload shorter than the prefix is masked whole")
	require.Equal(t, "<3 bytes>", inspect.ShowPrefix(8)([]byte{0, 1, 2}), "binary shows only its size")
	require.Equal(t, "", inspect.ShowPrefix(8)(nil))
	require.Equal(t, "h… <6 bytes>", inspect.ShowPrefix(2)([]byte("héllo")), "cut on a rune boundary")
	require.Equal(t, "3d4h", inspect.FormatAge(76*time.Hour+5*time.Minute))
	require.Equal(t, "2m5s", inspect.FormatAge(125*time.Second))
}

// One event is seen across the txlog, consume log, attempts and dead
// letters, payloads redacted; absent tables are reported, not fatal. On
// both databases: inspect's queries are the dialect's.
func TestEventAcrossTables(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testEventAcrossTables)
}

func testEventAcrossTables(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now().UTC()
	prefix := "i" + testenv.RandSuffix(6) + "_" // its own tables: Stuck and Stats count every row
	require.NoError(t, schema.MigrateAll(ctx, db, prefix))
	st, err := txlog.New(db, prefix)
	require.NoError(t, err)
	id := wire.NewEventID()
	payload := []byte(`{"order":"o-1","card":"4111111111111111"}`)
	tx, err := db.Beginx()
	require.NoError(t, err)
	require.NoError(t, st.Insert(ctx, tx, txlog.Row{EventID: id, ProducerGroup: "pg", Topic: "orders", EventType: "OrderPaid",
		State: txlog.StateCommitted, Payload: payload, PayloadHash: wire.Hash(payload), BusinessKey: "o-1", ResolvedBy: txlog.ByLocalCommit}))
	require.NoError(t, tx.Commit())
	_, err = db.Exec(db.Rebind(`INSERT INTO `+prefix+`consume_log (consumer_group, event_id, event_type, request_hash, status, first_received_at, updated_at)
		VALUES ('points', ?, 'OrderPaid', ?, 'SUCCESS', ?, ?)`), id, wire.Hash(payload), now, now)
	require.NoError(t, err)
	_, err = db.Exec(db.Rebind(`INSERT INTO `+prefix+`consume_attempt (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at)
		VALUES ('sms', ?, 2, 'transient', 'gateway timeout', ?, ?)`), id, now, now)
	require.NoError(t, err)
	_, err = db.Exec(db.Rebind(`INSERT INTO `+prefix+`dead_letter (consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type, business_key,
		error_class, error_text, payload, request_hash, properties, reconsume_times, status, first_seen_at, last_seen_at)
		VALUES ('search', 'orders', 1, 7, 'm', ?, 'OrderPaid', 'o-1', 'data', 'bad json', ?, ?, '{"RMQTX_EVENT_ID":"x"}', 0, 'PARKED',
		?, ?)`), id, payload, wire.Hash(payload), now, now)
	require.NoError(t, err)

	in, err := inspect.New(inspect.Config{DB: db, TablePrefix: prefix})
	require.NoError(t, err)
	v, err := in.Event(ctx, id)
	require.NoError(t, err)
	require.NotNil(t, v.Txlog)
	require.Equal(t, "COMMITTED", v.Txlog.State)
	require.Nil(t, v.Outbox)
	require.Len(t, v.Consumed, 1)
	require.Equal(t, "points", v.Consumed[0].ConsumerGroup)
	require.Len(t, v.Attempts, 1)
	require.Len(t, v.DeadLetters, 1)
	require.Equal(t, "x", v.DeadLetters[0].Properties["RMQTX_EVENT_ID"])
	require.Empty(t, v.Missing)
	// A prefix with no tables: every read reports its table missing, none fails.
	bare, err := inspect.New(inspect.Config{DB: db, TablePrefix: "none" + testenv.RandSuffix(6) + "_"})
	require.NoError(t, err)
	nv, err := bare.Event(ctx, id)
	require.ErrorIs(t, err, inspect.ErrNotFound)
	require.Len(t, nv.Missing, 6, "txlog, outbox, consume log, attempts, dead letters, replay items: %v", nv.Missing)
	js, err := json.Marshal(v)
	require.NoError(t, err)
	require.NotContains(t, string(js), "4111", "no payload content leaks")
	require.NotContains(t, string(js), `{\"order`, "not even a prefix: payloads are hidden by default")
	require.Equal(t, "<41 bytes>", v.Txlog.Payload, "the default shows sizes only")
	require.Equal(t, "<41 bytes>", v.DeadLetters[0].Payload)

	// Seeing payload bytes is an explicit opt-out.
	shown, err := inspect.New(inspect.Config{DB: db, TablePrefix: prefix, Redact: inspect.ShowPrefix(8)})
	require.NoError(t, err)
	sv, err := shown.Event(ctx, id)
	require.NoError(t, err)
	require.Equal(t, `{"order"… <41 bytes>`, sv.Txlog.Payload)

	views, err := in.BusinessKey(ctx, "o-1", 10)
	require.NoError(t, err)
	require.Len(t, views, 1)
	_, err = in.Event(ctx, "nope")
	require.ErrorIs(t, err, inspect.ErrNotFound)

	stuck, missing, err := in.Stuck(ctx, 0, 10)
	require.NoError(t, err)
	require.Len(t, stuck, 2, "the retrying attempt and the parked dead letter")
	require.Empty(t, missing)
	stats, _, err := in.Stats(ctx)
	require.NoError(t, err)
	require.Len(t, stats, 4)
}

// The remoting lookup finds a message by key in the broker's index, and
// tells a missing topic apart.
func TestRemotingLookup(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 2)
	g := testenv.Name(t, "pub")
	p, err := rmq.NewProducer(producer.WithNsResolver(s.NameServerResolver()), producer.WithGroupName(g), producer.WithInstanceName(g))
	require.NoError(t, err)
	require.NoError(t, p.Start())
	defer func() { _ = p.Shutdown() }()
	id := wire.NewEventID()
	m := primitive.NewMessage(topic, []byte("hello"))
	m.WithProperties(wire.Envelope{EventID: id, EventType: "T"}.Properties([]byte("hello")))
	m.WithKeys([]string{id, "other-key"})
	res, err := p.SendSync(context.Background(), m)
	require.NoError(t, err)

	look := inspect.RemotingLookup{NameServers: []string{s.NameServer}}
	var got []inspect.BrokerMessage
	testenv.Eventually(t, 30*time.Second, "indexed message", func() bool {
		got, err = look.QueryByKey(context.Background(), topic, id, 8)
		return err == nil && len(got) == 1
	})
	require.Equal(t, topic, got[0].Topic)
	require.Equal(t, res.MsgID, got[0].UniqKey)
	require.Equal(t, "message", got[0].Kind)
	require.Equal(t, 5, got[0].BodySize)
	none, err := look.QueryByKey(context.Background(), topic, "no-such-key", 8)
	require.NoError(t, err)
	require.Empty(t, none)
	_, err = look.QueryByKey(context.Background(), testenv.Name(t, "missing"), id, 8)
	require.ErrorIs(t, err, inspect.ErrTopicNotFound)
}

// DeadLetters filters in the database (ids, topic, status, ...) before the
// limit, and DeadLetter finds one by id. On both databases: the filter is
// built in the dialect's SQL.
func TestDeadLettersFilter(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testDeadLettersFilter)
}

func testDeadLettersFilter(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	now := time.Now().UTC()
	for _, topic := range []string{"orders", "refunds", "orders", "refunds"} {
		_, err := db.Exec(db.Rebind(`INSERT INTO rmqtx_dead_letter (consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type,
			business_key, error_class, error_text, payload, request_hash, properties, reconsume_times, status, first_seen_at, last_seen_at)
			VALUES ('g', ?, 0, 0, 'm', ?, 'T', 'k', 'data', 'bad', ?, ?, '{}', 0, 'PARKED', ?, ?)`),
			topic, wire.NewEventID(), []byte("p"), wire.Hash([]byte("p")), now, now)
		require.NoError(t, err)
	}
	// The ids in insert order (PostgreSQL's driver has no LastInsertId).
	var ids []int64
	require.NoError(t, db.Select(&ids, "SELECT id FROM rmqtx_dead_letter ORDER BY id"))
	require.Len(t, ids, 4)
	in, err := inspect.New(inspect.Config{DB: db})
	require.NoError(t, err)
	idsOf := func(rows []inspect.DeadLetterRow) []int64 {
		out := []int64{}
		for _, r := range rows {
			out = append(out, r.ID)
		}
		return out
	}
	rows, err := in.DeadLetters(ctx, inspect.DeadLetterFilter{Topic: "refunds", Limit: 1})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[1]}, idsOf(rows), "the limit counts matching rows only")
	rows, err = in.DeadLetters(ctx, inspect.DeadLetterFilter{IDs: []int64{ids[3], ids[0]}, Topic: "orders"})
	require.NoError(t, err)
	require.Equal(t, []int64{ids[0]}, idsOf(rows))
	rows, err = in.DeadLetters(ctx, inspect.DeadLetterFilter{Status: "REPLAYED"})
	require.NoError(t, err)
	require.NotNil(t, rows)
	require.Empty(t, rows)
	d, err := in.DeadLetter(ctx, ids[2])
	require.NoError(t, err)
	require.Equal(t, "orders", d.Topic)
	_, err = in.DeadLetter(ctx, ids[3]+100)
	require.ErrorIs(t, err, inspect.ErrNotFound)
}
