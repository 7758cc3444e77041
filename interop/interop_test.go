package interop

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// javaStart bounds a JVM start plus the client's first route and rebalance
// on a loaded two-core machine.
const javaStart = 60 * time.Second

// TestJavaConsumesRmqtxEvents: a plain Java DefaultMQPushConsumer that
// filters by tag receives every committed rmqtx event of its types once per
// id, from the transactional producer (no tag set: the type is mirrored) and
// from the outbox sink, and none that rolled back or has another type. Each
// message carries the id as its last key, a payload hash the Java side
// verifies, the format version and the event version.
func TestJavaConsumesRmqtxEvents(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	java := startJava(t, "Consume", s.NameServer, topic, testenv.Name(t, "javacg"), "OrderPlaced || OrderShipped")

	db := testenv.DB(t)
	ctx := context.Background()
	p := startProducer(t, s, db, topic)
	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{s.NameServer}, Group: testenv.Name(t, "obx")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	java.WaitLine(javaStart, "READY")

	want := map[string]string{} // id -> type the Java consumer must see
	var unwanted []string       // rolled back, or a type it does not subscribe to
	errNo := errors.New("business rule says no")
	for i := range 50 {
		m := txproducer.Message{Topic: topic, EventType: "OrderPlaced", BusinessKey: fmt.Sprintf("o-%d", i),
			Payload: fmt.Appendf(nil, `{"order":%d}`, i)}
		fn := func(context.Context, *sqlx.Tx) error { return nil }
		switch {
		case i%5 == 4:
			fn = func(context.Context, *sqlx.Tx) error { return errNo }
		case i%5 == 3:
			m.EventType = "Other"
		}
		res, err := p.Send(ctx, m, fn)
		switch {
		case i%5 == 4:
			require.ErrorIs(t, err, errNo)
			require.Equal(t, txproducer.StateRolledBack, res.State)
			unwanted = append(unwanted, res.EventID)
		case i%5 == 3:
			require.NoError(t, err)
			unwanted = append(unwanted, res.EventID)
		default:
			require.NoError(t, err)
			require.Equal(t, txproducer.StateCommitted, res.State)
			want[res.EventID] = "OrderPlaced"
		}
	}
	for i := range 10 {
		e := outbox.Event{EventID: wire.NewEventID(), EventType: "OrderShipped", Destination: topic,
			MessageKey: fmt.Sprintf("ship-%d", i), Payload: fmt.Appendf(nil, `{"ship":%d}`, i)}
		require.NoError(t, sink.Send(ctx, &outbox.Message{Event: e, Attempt: 1}))
		want[e.EventID] = "OrderShipped"
	}

	java.WaitFor(60*time.Second, fmt.Sprintf("%d distinct event ids", len(want)), func(lines [][]string) bool {
		return len(javaIDs(lines)) >= len(want)
	})
	lines := java.Lines()
	got := javaIDs(lines)
	require.Equal(t, slices.Sorted(maps.Keys(want)), slices.Sorted(maps.Keys(got)), "distinct ids at the Java consumer = committed ids of its types")
	for _, id := range unwanted {
		require.NotContains(t, got, id, "rolled back or not subscribed")
	}
	for _, l := range lines {
		if l[0] != "MSG" {
			continue
		}
		id, tag, lastKey, hashOK, version, format := l[1], l[2], l[3], l[4], l[5], l[6]
		require.Equal(t, want[id], tag, "%s: the event type is the tag", id)
		require.Equal(t, id, lastKey, "%s: the event id is the last key", id)
		require.Equal(t, "true", hashOK, "%s: payload hash verified in Java", id)
		require.Equal(t, "0", version, "%s: event version always sent", id)
		require.Equal(t, "1", format, "%s: format version", id)
	}
	t.Logf("java consumer: %d deliveries, %d distinct ids, %d rolled back or other type not seen", len(lines)-1, len(got), len(unwanted))
}

// javaIDs counts MSG lines per event id.
func javaIDs(lines [][]string) map[string]int {
	ids := map[string]int{}
	for _, l := range lines {
		if l[0] == "MSG" && len(l) >= 7 {
			ids[l[1]]++
		}
	}
	return ids
}

// TestJavaNaturalProducersAdopted: a Java TransactionMQProducer written the
// natural way (tag = type, key = order number, JSON body; some commits only
// through the broker's check-back, some orders sent twice, some rolled back)
// and a plain DefaultMQProducer (request id in a property, the first message
// sent twice). With adoption on, the rmqtx consumer applies each committed
// order and each request once, absorbs the second copies as duplicates,
// never applies a rolled-back order, and parks the one message without a key
// with a clear error. An independent collector counts the copies on the
// broker.
func TestJavaNaturalProducersAdopted(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	run := testenv.RandSuffix(6)
	const orders, rollbackEvery, unknownEvery, dupEvery, plain = 40, 5, 10, 4, 5
	java := startJava(t, "NaturalProducers", s.NameServer, topic, testenv.Name(t, "javapg"), run,
		fmt.Sprint(orders), fmt.Sprint(rollbackEvery), fmt.Sprint(unknownEvery), fmt.Sprint(dupEvery), fmt.Sprint(plain))
	coll := testenv.Collect(t, topic)

	db := testenv.DB(t)
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	_, err := db.Exec(`CREATE TABLE applied (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL,
		event_type VARCHAR(64) NOT NULL, business_key VARCHAR(128) NOT NULL, body VARBINARY(512) NOT NULL)`)
	require.NoError(t, err)
	apply := func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		_, err := tx.ExecContext(ctx, "INSERT INTO applied (event_id, event_type, business_key, body) VALUES (?, ?, ?, ?)",
			ev.ID, ev.Type, ev.BusinessKey, ev.Payload)
		return err
	}
	c, err := consumer.New(consumer.Config{
		Group: testenv.Name(t, "cg"), DB: db,
		// Every message without RMQTX_EVENT_ID: the id is the first
		// key (the order number), the type is the tag.
		Adopt: &consumer.Adoption{ID: consumer.IDFromKeys, TypeFromTag: true},
		Routes: map[string]consumer.Route{
			"OrderPlaced": {Handler: apply},
			// This producer sets no key: the id is its request id.
			"OrderCancelled": {Handler: apply, Adopt: &consumer.Adoption{ID: consumer.IDFromProperty, Property: "requestId", TypeFromTag: true}},
		},
		NameServers: []string{s.NameServer},
		Topic:       topic,
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Shutdown(ctx)
	})

	java.WaitLine(javaStart+60*time.Second, "DONE")
	lines := java.Lines()
	committed, rolledBack := map[string]bool{}, map[string]bool{}
	copies, dups, keyless := 0, 0, 0
	seen := map[string]int{}
	unknown, checkedCommit := map[string]bool{}, map[string]bool{}
	for _, l := range lines {
		switch l[0] {
		case "CHECK":
			if l[2] == "COMMIT_MESSAGE" {
				checkedCommit[l[1]] = true
			}
		case "TX":
			key, plan, status := l[1], l[2], l[3]
			require.Equal(t, "SEND_OK", status, "send of %s", key)
			if plan == "rollback" {
				rolledBack[key] = true
				continue
			}
			if plan == "unknown" {
				// The first answer was UNKNOW: only the broker's check-back
				// commits it.
				require.Equal(t, "UNKNOW", l[4], "local state of %s", key)
				unknown[key] = true
			}
			copies++
			if key == "-" {
				keyless++
				continue
			}
			committed[key] = true
			seen[key]++
			if seen[key] == 2 {
				dups++
			}
		case "PLAIN":
			require.Equal(t, "SEND_OK", l[2], "send of %s", l[1])
			copies++
			committed[l[1]] = true
			seen[l[1]]++
			if seen[l[1]] == 2 {
				dups++
			}
		}
	}
	// The plan as NaturalProducers documents it.
	require.Equal(t, orders/rollbackEvery, len(rolledBack))
	require.Equal(t, orders-orders/rollbackEvery+plain, len(committed))
	require.Equal(t, 1, keyless)
	require.Positive(t, dups)
	require.Equal(t, len(committed)+dups+keyless, copies)
	require.Len(t, unknown, orders/unknownEvery)
	for key := range unknown {
		require.True(t, checkedCommit[key], "%s committed by a check-back", key)
	}

	// The independent count: every committed copy is on the broker, no
	// rolled-back order is.
	require.True(t, coll.WaitUntil(60*time.Second, func(s testenv.Snapshot) bool { return s.Distinct() >= copies }),
		"collector saw %d of %d committed copies", coll.Snapshot().Distinct(), copies)

	p := c.Processor()
	testenv.Eventually(t, 60*time.Second, "every committed order applied and the keyless one parked", func() bool {
		st := p.Stats()
		return st.Applied >= int64(len(committed)) && st.Parked >= 1 && st.Duplicates >= int64(dups)
	})
	st := p.Stats()
	require.EqualValues(t, len(committed), st.Applied, "%+v", st)
	require.Zero(t, st.Conflicts)

	snap := coll.Snapshot()
	require.Equal(t, copies, snap.Distinct(), "copies on the broker")
	for id := range snap.Counts {
		m := coll.Message(id)
		require.False(t, rolledBack[m.GetKeys()], "rolled-back order %s reached the broker", m.GetKeys())
	}

	type row struct {
		ID   string `db:"event_id"`
		Type string `db:"event_type"`
		Key  string `db:"business_key"`
		N    int    `db:"n"`
	}
	var rows []row
	require.NoError(t, db.Select(&rows, "SELECT event_id, event_type, business_key, COUNT(*) AS n FROM applied GROUP BY event_id, event_type, business_key"))
	applied := map[string]bool{}
	for _, r := range rows {
		require.Equal(t, 1, r.N, "%s applied once", r.ID)
		require.False(t, rolledBack[r.ID], "rolled-back order %s applied", r.ID)
		if strings.HasPrefix(r.ID, "order-") {
			require.Equal(t, "OrderPlaced", r.Type)
			require.Equal(t, r.ID, r.Key, "the key is also the business key")
		} else {
			require.Equal(t, "OrderCancelled", r.Type)
		}
		applied[r.ID] = true
	}
	require.Equal(t, committed, applied, "each committed order and request applied once")

	dls, err := p.DeadLetters().List(ctx, consumer.DeadLetterFilter{ConsumerGroup: p.Config().Group})
	require.NoError(t, err)
	require.Len(t, dls, 1, "only the keyless message is parked")
	require.Equal(t, consumer.ClassData, dls[0].ErrorClass)
	require.Contains(t, dls[0].ErrorText, "no message keys to take the event id from")
	require.Equal(t, "OrderPlaced", dls[0].Properties[wire.PropTags])
	t.Logf("natural java: %d copies, %d committed, %d duplicates absorbed, %d rolled back, stats %+v", copies, len(committed), dups, len(rolledBack), st)
}

// TestJavaWireFormatVersionGuard: a Java producer that writes the documented
// wire format sends aggregate versions newest first. The strict version
// guard applies every version once and in order, a resend is a duplicate, a
// stale version is skipped, an upper-case payload hash is accepted, and a
// message in a future format version is parked, not guessed at.
func TestJavaWireFormatVersionGuard(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	run := testenv.RandSuffix(6)
	const aggregates, versions = 5, 4
	java := startJava(t, "WireProducer", s.NameServer, topic, testenv.Name(t, "javawp"), run, fmt.Sprint(aggregates), fmt.Sprint(versions))

	db := testenv.DB(t)
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	_, err := db.Exec(`CREATE TABLE moves (id BIGINT AUTO_INCREMENT PRIMARY KEY, event_id VARCHAR(64) NOT NULL,
		box VARCHAR(128) NOT NULL, version BIGINT NOT NULL)`)
	require.NoError(t, err)
	c, err := consumer.New(consumer.Config{
		Group: testenv.Name(t, "cg"), DB: db, VersionMode: consumer.VersionStrict,
		Routes: map[string]consumer.Route{"BoxMoved": {Handler: func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
			_, err := tx.ExecContext(ctx, "INSERT INTO moves (event_id, box, version) VALUES (?, ?, ?)", ev.ID, ev.AggregateID, ev.AggregateVersion)
			return err
		}}},
		// Gaps are retried after 1 s (the shortest delay level), so the
		// newest-first order resolves within seconds.
		DelayLevel:  func(consumer.Class, int) int { return 1 },
		NameServers: []string{s.NameServer},
		Topic:       topic,
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Shutdown(ctx)
	})

	java.WaitLine(javaStart, "DONE")
	kinds := map[string]int{}
	for _, l := range java.Lines() {
		if l[0] == "WIRE" {
			require.Equal(t, "SEND_OK", l[5], "send of %s", l[1])
			kinds[l[4]]++
		}
	}
	require.Equal(t, map[string]int{"event": aggregates * versions, "resend": 1, "stale": 1, "future": 1}, kinds)

	p := c.Processor()
	testenv.Eventually(t, 60*time.Second, "every version applied, the resend absorbed, the stale one skipped, the future format parked", func() bool {
		st := p.Stats()
		return st.Applied >= aggregates*versions && st.Duplicates >= 1 && st.Stale >= 1 && st.Parked >= 1
	})
	st := p.Stats()
	require.EqualValues(t, aggregates*versions, st.Applied, "%+v", st)
	require.EqualValues(t, 1, st.Stale, "%+v", st)
	require.Zero(t, st.Conflicts, "an upper-case hash is the same hash")
	require.Positive(t, st.Gaps, "the newest-first order made the guard wait")

	for a := range aggregates {
		box := fmt.Sprintf("box-%s-%d", run, a)
		var got []int64
		require.NoError(t, db.Select(&got, "SELECT version FROM moves WHERE box = ? ORDER BY id", box))
		require.Equal(t, []int64{1, 2, 3, 4}, got, "%s: every version once, in order", box)
	}
	dls, err := p.DeadLetters().List(ctx, consumer.DeadLetterFilter{ConsumerGroup: p.Config().Group})
	require.NoError(t, err)
	require.Len(t, dls, 1, "only the future-format message is parked")
	require.Equal(t, consumer.ClassData, dls[0].ErrorClass)
	require.Contains(t, dls[0].ErrorText, "unsupported format version 2")
	t.Logf("wire java: stats %+v", st)
}

func startProducer(t *testing.T, s testenv.Settings, db *sqlx.DB, topic string) *txproducer.Producer {
	t.Helper()
	require.NoError(t, schema.MigrateAll(context.Background(), db, txlog.DefaultPrefix))
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{s.NameServer}, Group: testenv.Name(t, "pg"), DB: db,
		FenceAge: 4 * time.Second, WarmupTopics: []string{topic}, DisableRecovery: true,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	return p
}
