package rmqtxtest_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/rmqtxtest"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// These tests are written the way a user of rmqtx tests a handler: the real
// txproducer.Producer and consumer.Consumer on the user's database, the
// kit's in-process broker between them, and a fault of the broker's making.
// They prove the effect on the business rows, never on the components'
// internals. testenv only provides the fresh databases (EachDB: MariaDB and
// PostgreSQL); a user's own test opens its test database instead.

// accountCredited is the event's payload: credit Amount to Account.
type accountCredited struct {
	Account string `json:"account"`
	Amount  int64  `json:"amount"`
}

// setupCredits migrates db (rmqtx's tables) and creates the business table
// the handlers write: one row per applied credit, in the order applied
// (seq). No unique key on event_id: a credit applied twice would show as two
// rows rather than as a key error.
func setupCredits(t *testing.T, db *sqlx.DB) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	seq := "seq BIGINT AUTO_INCREMENT PRIMARY KEY"
	if db.DriverName() != "mysql" {
		seq = "seq BIGSERIAL PRIMARY KEY"
	}
	_, err := db.ExecContext(ctx, `CREATE TABLE credit (`+seq+`,
		grp VARCHAR(64) NOT NULL,
		event_id VARCHAR(64) NOT NULL,
		account_id VARCHAR(64) NOT NULL,
		version BIGINT NOT NULL,
		amount BIGINT NOT NULL)`)
	require.NoError(t, err)
}

// creditHandler is the user's handler: it applies the credit in the
// consumer's transaction, so the dedup row and the credit commit together.
func creditHandler(group string) consumer.Handler {
	return func(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
		var c accountCredited
		if err := json.Unmarshal(ev.Payload, &c); err != nil {
			return consumer.BadData(err)
		}
		_, err := tx.ExecContext(ctx, tx.Rebind(
			"INSERT INTO credit (grp, event_id, account_id, version, amount) VALUES (?, ?, ?, ?, ?)"),
			group, ev.ID, c.Account, ev.AggregateVersion, c.Amount)
		if err != nil {
			return consumer.Transient(err)
		}
		return nil
	}
}

// credited is one applied credit as the business table holds it.
type credited struct {
	EventID string `db:"event_id"`
	Account string `db:"account_id"`
	Version int64  `db:"version"`
	Amount  int64  `db:"amount"`
}

// creditsOf returns group's applied credits per account, each account's in
// the order they were applied (accounts are independent: their events run in
// parallel).
func creditsOf(t *testing.T, db *sqlx.DB, group string) []credited {
	t.Helper()
	var out []credited
	require.NoError(t, db.Select(&out, db.Rebind(
		"SELECT event_id, account_id, version, amount FROM credit WHERE grp = ? ORDER BY account_id, seq"), group))
	return out
}

// settled reports whether c reached a final outcome (applied, dedup hit,
// stale, parked, ignored) for every copy of an event that the broker holds
// on topic. A copy that is retried comes back and ends in one final outcome,
// so once they match nothing of topic is in flight and no effect can still
// arrive.
func settled(b *rmqtxtest.Broker, c *consumer.Consumer, topic string) bool {
	s := c.Processor().Stats()
	return s.Applied+s.Duplicates+s.Stale+s.Parked+s.Ignored == int64(len(b.Messages(topic)))
}

// sendCredit sends an AccountCredited event of acc's version v through p.
// The local transaction is the producer side's business write; here it has
// none, which is enough for a consumer test.
func sendCredit(ctx context.Context, t *testing.T, p *txproducer.Producer, topic, acc string, v, amount int64) txproducer.Result {
	t.Helper()
	payload, err := json.Marshal(accountCredited{Account: acc, Amount: amount})
	require.NoError(t, err)
	res, err := p.Send(ctx, txproducer.Message{Topic: topic, EventType: "AccountCredited",
		AggregateType: "Account", AggregateID: acc, AggregateVersion: v, Payload: payload},
		func(context.Context, *sqlx.Tx) error { return nil })
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)
	return res
}

// Issue 32's handler test. The broker stores one event twice (DuplicateNext:
// what a producer retry, a double commit or a lost ACK does) and holds three
// versions of one account, then appends them reversed (Hold, Release: a
// reordering). Two consumer groups read the topic: the default strict
// version guard (only last+1 applies; a later version waits and is
// redelivered) and the monotonic one (a newer version applies, an older one
// is skipped as STALE; consumer/doc.go). The business rows show exactly one
// credit per event, the strict group's credits of the reordered account in
// version order, and the monotonic group's only of the newest version.
func TestHandlerAppliesEachEventOnceAndInOrder(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		setupCredits(t, db)
		b := rmqtxtest.NewBroker(t)
		const topic, strictGroup, monoGroup = "accounts", "ledger-strict", "ledger-monotonic"
		p := rmqtxtest.NewProducer(t, b, txproducer.Config{DB: db})
		strict := rmqtxtest.NewConsumer(t, b, consumer.Config{Group: strictGroup, DB: db, Topic: topic,
			Routes: map[string]consumer.Route{"AccountCredited": {Handler: creditHandler(strictGroup)}}})
		mono := rmqtxtest.NewConsumer(t, b, consumer.Config{Group: monoGroup, DB: db, Topic: topic,
			VersionMode: consumer.VersionMonotonic,
			Routes:      map[string]consumer.Route{"AccountCredited": {Handler: creditHandler(monoGroup)}}})

		began := time.Now()
		// A duplicate: acc-A's only event is stored twice.
		b.DuplicateNext(topic)
		dup := sendCredit(ctx, t, p, topic, "acc-A", 1, 10)
		// A reordering: acc-B's versions 1, 2, 3 are sent in order and
		// reach the consumers as 3, 2, 1.
		b.Hold(topic)
		var sent []string
		for v, amount := range []int64{1, 2, 4} {
			sent = append(sent, sendCredit(ctx, t, p, topic, "acc-B", int64(v+1), amount).EventID)
		}
		b.Release(topic, true)

		// The broker did what the test asked: two copies of acc-A's event
		// (one message id), acc-B's versions stored 3, 2, 1.
		msgs, err := b.WaitMessages(ctx, topic, 5)
		require.NoError(t, err)
		var copiesA int
		var orderB []int64
		for _, m := range msgs {
			env, err := wire.Decode(m.Properties)
			require.NoError(t, err)
			switch env.AggregateID {
			case "acc-A":
				copiesA++
				require.Equal(t, dup.EventID, env.EventID)
			case "acc-B":
				orderB = append(orderB, env.AggregateVersion)
			}
		}
		require.Equal(t, 2, copiesA, "DuplicateNext stored acc-A's event twice")
		require.Equal(t, []int64{3, 2, 1}, orderB, "Release(reverse) stored acc-B's versions reversed")

		require.Eventually(t, func() bool { return settled(b, strict, topic) && settled(b, mono, topic) },
			time.Minute, 5*time.Millisecond, "every copy of every event reaches a final outcome in both groups")

		// Strict: each event once; acc-B applied 1, 2, 3 although it
		// arrived 3, 2, 1 (versions 3 and 2 waited for their predecessors).
		require.Equal(t, []credited{
			{dup.EventID, "acc-A", 1, 10},
			{sent[0], "acc-B", 1, 1}, {sent[1], "acc-B", 2, 2}, {sent[2], "acc-B", 3, 4},
		}, creditsOf(t, db, strictGroup))
		s := strict.Processor().Stats()
		require.Equal(t, int64(4), s.Applied)
		require.Equal(t, int64(1), s.Duplicates, "the second copy of acc-A's event is a dedup hit")
		require.GreaterOrEqual(t, s.Gaps, int64(2), "versions 3 and 2 arrived before version 1 and waited")
		require.Zero(t, s.Parked+s.Stale)

		// Monotonic: each event at most once; acc-B's version 3 came first
		// and applied, versions 2 and 1 were older and skipped as STALE.
		require.Equal(t, []credited{
			{dup.EventID, "acc-A", 1, 10}, {sent[2], "acc-B", 3, 4},
		}, creditsOf(t, db, monoGroup))
		m := mono.Processor().Stats()
		require.Equal(t, int64(2), m.Applied)
		require.Equal(t, int64(1), m.Duplicates)
		require.Equal(t, int64(2), m.Stale, "versions 2 and 1 came after version 3")
		require.Zero(t, m.Parked+m.Gaps)
		t.Logf("kit handler test (%s): 4 events, 1 duplicated, 3 reordered, two groups settled and proven in %s",
			db.DriverName(), time.Since(began).Round(time.Millisecond))
	})
}

// A Send whose END_TRANSACTION the broker never receives (LoseEndTransaction:
// a connection lost right after the local transaction, a producer killed
// between COMMIT and the end) leaves its half pending; the broker's check
// (CheckNow) is answered from the txlog row the local transaction wrote:
// COMMIT for a committed Send, whose event then reaches the topic, ROLLBACK
// for a rolled-back one, which never does. A keyed Send sends one
// END_TRANSACTION too (its own, as a request).
func TestHandlerCheckDecidesLostEndTransaction(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		setupCredits(t, db)
		b := rmqtxtest.NewBroker(t)
		const topic = "accounts"
		p := rmqtxtest.NewProducer(t, b, txproducer.Config{DB: db})
		// No aggregate and no business key: the client ends the transaction
		// with its one-way END_TRANSACTION (a keyed Send ends it itself,
		// with a request; see txproducer's endsync.go).
		send := func(fn txproducer.LocalTxFunc) (txproducer.Result, error) {
			return p.Send(ctx, txproducer.Message{Topic: topic, EventType: "AccountCredited",
				Payload: []byte(`{"account":"acc-C","amount":5}`)}, fn)
		}

		b.LoseEndTransaction(1)
		committed, err := send(func(ctx context.Context, tx *sqlx.Tx) error {
			_, err := tx.ExecContext(ctx, tx.Rebind(
				"INSERT INTO credit (grp, event_id, account_id, version, amount) VALUES (?, ?, ?, ?, ?)"),
				"producer", "local", "acc-C", 0, 5)
			return err
		})
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, committed.State)
		require.Equal(t, []string{committed.MsgID}, halfIDs(b.Pending()), "the half waits for a decision")
		require.Empty(t, b.Messages(topic))

		checks, err := b.CheckNow(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, checks)
		msgs, err := b.WaitMessages(ctx, topic, 1)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.Equal(t, committed.MsgID, msgs[0].MsgID, "the check committed the half")
		env, err := wire.Decode(msgs[0].Properties)
		require.NoError(t, err)
		require.Equal(t, committed.EventID, env.EventID)
		require.Empty(t, b.Pending())

		b.LoseEndTransaction(1)
		refused := errors.New("account closed")
		rolledBack, err := send(func(context.Context, *sqlx.Tx) error { return refused })
		require.ErrorIs(t, err, refused)
		require.ErrorIs(t, err, txproducer.ErrLocalTx)
		require.Equal(t, txproducer.StateRolledBack, rolledBack.State)
		require.Equal(t, []string{rolledBack.MsgID}, halfIDs(b.Pending()))

		checks, err = b.CheckNow(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, checks)
		require.Empty(t, b.Pending())
		require.Contains(t, halfIDs(b.RolledBack()), rolledBack.MsgID, "the check rolled the half back")
		require.Len(t, b.Messages(topic), 1, "only the committed event reached the topic")

		// A keyed Send (an aggregate) ends its commit itself, with one
		// END_TRANSACTION sent as a request it waits for (KitSendTimeout),
		// to keep the aggregate's order; the client sends none of its own.
		// Losing that one leaves the half to the check, as for a keyless
		// Send.
		b.LoseEndTransaction(1)
		keyed, err := p.Send(ctx, txproducer.Message{Topic: topic, EventType: "AccountCredited",
			AggregateType: "Account", AggregateID: "acc-C", AggregateVersion: 1,
			Payload: []byte(`{"account":"acc-C","amount":6}`)}, func(context.Context, *sqlx.Tx) error { return nil })
		require.NoError(t, err, "the commit's lost end is the check's to repair, not an error")
		require.Equal(t, txproducer.StateCommitted, keyed.State)
		require.Equal(t, []string{keyed.MsgID}, halfIDs(b.Pending()))
		checks, err = b.CheckNow(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, checks)
		msgs, err = b.WaitMessages(ctx, topic, 2)
		require.NoError(t, err)
		var ids []string
		for _, m := range msgs {
			ids = append(ids, m.MsgID)
		}
		require.ElementsMatch(t, []string{committed.MsgID, keyed.MsgID}, ids, "the check committed the keyed half")
		require.Empty(t, b.Pending())

		var rows int
		require.NoError(t, db.Get(&rows, "SELECT COUNT(*) FROM credit"))
		require.Equal(t, 1, rows, "only the committed local transaction wrote")
	})
}

// halfIDs returns the message ids (UNIQ_KEY) of hs.
func halfIDs(hs []rmqtxtest.Half) []string {
	ids := make([]string, 0, len(hs))
	for _, h := range hs {
		ids = append(ids, h.MsgID)
	}
	return ids
}

// A half message the broker refuses once (FailNextSend: SYSTEM_ERROR, what a
// broker under pressure answers). With the client's retries off, Send fails
// before the local transaction runs, says ErrSend, and RetryAdvice says to
// send again with the same event id, which then commits the event once.
// With the client's default retries (2), the client sends the half again on
// its own and the caller never sees the refusal.
func TestHandlerSendFailsOnce(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		setupCredits(t, db)
		b := rmqtxtest.NewBroker(t)
		var ran atomic.Int32
		msg := func(topic, id string) txproducer.Message {
			return txproducer.Message{Topic: topic, EventID: id, EventType: "AccountCredited",
				AggregateType: "Account", AggregateID: "acc-D", AggregateVersion: 1,
				Payload: []byte(`{"account":"acc-D","amount":7}`)}
		}
		fn := func(context.Context, *sqlx.Tx) error { ran.Add(1); return nil }

		t.Run("no client retries", func(t *testing.T) {
			const topic = "accounts-noretry"
			p := rmqtxtest.NewProducer(t, b, txproducer.Config{DB: db, SendRetries: -1})
			ran.Store(0)
			b.FailNextSend(topic)
			res, err := p.Send(ctx, msg(topic, ""), fn)
			require.ErrorIs(t, err, txproducer.ErrSend)
			require.Equal(t, txproducer.RetryWithSameID, txproducer.RetryAdvice(err), "%v", err)
			require.NotEqual(t, txproducer.StateCommitted, res.State)
			require.NotEmpty(t, res.EventID)
			require.Zero(t, ran.Load(), "the local transaction does not run without a stored half")
			require.Empty(t, b.Pending())
			require.Empty(t, b.Messages(topic))

			again, err := p.Send(ctx, msg(topic, res.EventID), fn)
			require.NoError(t, err)
			require.Equal(t, txproducer.StateCommitted, again.State)
			require.False(t, again.Duplicate)
			require.Equal(t, res.EventID, again.EventID)
			require.Equal(t, int32(1), ran.Load())
			requireEventsOnTopic(ctx, t, b, topic, res.EventID)
		})
		t.Run("client retries", func(t *testing.T) {
			const topic = "accounts-retry"
			p := rmqtxtest.NewProducer(t, b, txproducer.Config{DB: db})
			ran.Store(0)
			b.FailNextSend(topic)
			res, err := p.Send(ctx, msg(topic, ""), fn)
			require.NoError(t, err, "the client's own retry absorbed the refusal")
			require.Equal(t, txproducer.StateCommitted, res.State)
			require.Equal(t, int32(1), ran.Load())
			requireEventsOnTopic(ctx, t, b, topic, res.EventID)
		})
	})
}

// requireEventsOnTopic waits for topic to hold one message per id in ids and
// fails unless it holds exactly those, once each.
func requireEventsOnTopic(ctx context.Context, t *testing.T, b *rmqtxtest.Broker, topic string, ids ...string) {
	t.Helper()
	msgs, err := b.WaitMessages(ctx, topic, len(ids))
	require.NoError(t, err)
	got := make([]string, 0, len(msgs))
	for _, m := range msgs {
		env, err := wire.Decode(m.Properties)
		require.NoError(t, err)
		got = append(got, env.EventID)
	}
	require.ElementsMatch(t, ids, got, "events on %s", topic)
	require.Empty(t, b.Pending(), "no half of %s left pending", topic)
}

// The README's handler test ("Testing your code"), on both databases. Its
// body, creditAppliedOnce, is the README's code from the line after
// openTestDB on: keep the two the same.
func TestHandlerReadmeCreditAppliedOnce(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx := context.Background()
		require.NoError(t, schema.MigrateAll(ctx, db, ""))
		_, err := db.ExecContext(ctx, "CREATE TABLE account (id VARCHAR(64) PRIMARY KEY, balance BIGINT NOT NULL)")
		require.NoError(t, err)
		_, err = db.ExecContext(ctx, "INSERT INTO account (id, balance) VALUES ('a-1', 0)")
		require.NoError(t, err)
		creditAppliedOnce(t, db)
	})
}

func creditAppliedOnce(t *testing.T, db *sqlx.DB) {
	ctx := context.Background()
	b := rmqtxtest.NewBroker(t)
	p := rmqtxtest.NewProducer(t, b, txproducer.Config{DB: db})
	c := rmqtxtest.NewConsumer(t, b, consumer.Config{
		Group: "ledger", DB: db, Topic: "accounts",
		Routes: map[string]consumer.Route{"AccountCredited": {Handler: creditAccount}},
	})

	b.DuplicateNext("accounts") // the broker stores, and delivers, the next event twice
	_, err := p.Send(ctx, txproducer.Message{Topic: "accounts", EventType: "AccountCredited",
		Payload: []byte(`{"account":"a-1","amount":5}`)},
		func(context.Context, *sqlx.Tx) error { return nil })
	require.NoError(t, err)

	// Both copies handled: one applied, one a dedup hit.
	require.Eventually(t, func() bool {
		s := c.Processor().Stats()
		return s.Applied+s.Duplicates == 2
	}, 10*time.Second, 5*time.Millisecond)
	var balance int64
	require.NoError(t, db.Get(&balance, db.Rebind("SELECT balance FROM account WHERE id = ?"), "a-1"))
	require.Equal(t, int64(5), balance) // credited once
}

// creditAccount is the README's handler: the credit and the dedup row
// commit in one transaction.
func creditAccount(ctx context.Context, tx *sqlx.Tx, ev consumer.Event) error {
	var c struct {
		Account string `json:"account"`
		Amount  int64  `json:"amount"`
	}
	if err := json.Unmarshal(ev.Payload, &c); err != nil {
		return consumer.BadData(err) // parked, not retried
	}
	_, err := tx.ExecContext(ctx, tx.Rebind("UPDATE account SET balance = balance + ? WHERE id = ?"), c.Amount, c.Account)
	return err
}

// The outbox through the kit: a row enqueued in the business transaction,
// without Notify, is claimed within the kit's PollInterval; the broker
// refuses its first send (FailNextSend), the dispatcher marks it RETRY and
// sends it again after the kit's short backoff; the topic holds it once.
func TestKitDispatcherRetriesARefusedSend(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, schema.MigrateAll(ctx, db, ""))
		b := rmqtxtest.NewBroker(t)
		outcomes := make(chan outbox.Outcome, 8)
		d := rmqtxtest.NewDispatcher(t, b, outbox.Config{DB: db,
			OnOutcome: func(o outbox.Outcome) { outcomes <- o }})

		b.FailNextSend("orders")
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		id, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "OrderPlaced", Destination: "orders",
			AggregateType: "Order", AggregateID: "o-1", AggregateVersion: 1, Payload: []byte(`{"order":"o-1"}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())

		var statuses []outbox.Status
		for len(statuses) == 0 || statuses[len(statuses)-1] != outbox.StatusSent {
			select {
			case o := <-outcomes:
				require.Equal(t, id, o.EventID)
				statuses = append(statuses, o.Status)
			case <-ctx.Done():
				t.Fatalf("no SENT outcome; got %v", statuses)
			}
		}
		require.Equal(t, []outbox.Status{outbox.StatusRetry, outbox.StatusSent}, statuses)
		requireEventsOnTopic(ctx, t, b, "orders", id)
		require.Equal(t, int64(1), d.Stats().Retried)
	})
}

// Discard recovery through the kit: a committed Send whose end was lost and
// whose half the broker then discards (DiscardHalves: transactionCheckMax
// checks passed) is published again by the producer's discard recovery,
// from its txlog row, once.
func TestKitProducerRecoveryRepublishesADiscardedHalf(t *testing.T) {
	t.Parallel()
	testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, schema.MigrateAll(ctx, db, ""))
		b := rmqtxtest.NewBroker(t)
		decided := make(chan discard.Result, 4)
		p := rmqtxtest.NewProducer(t, b, txproducer.Config{DB: db,
			OnRecovery: func(r discard.Result) { decided <- r }})

		b.LoseEndTransaction(1)
		res, err := p.Send(ctx, txproducer.Message{Topic: "orders", EventType: "OrderPlaced",
			Payload: []byte(`{"order":"o-2"}`)}, func(context.Context, *sqlx.Tx) error { return nil })
		require.NoError(t, err)
		require.Equal(t, txproducer.StateCommitted, res.State)
		n, err := b.DiscardHalves(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Empty(t, b.Pending())

		select {
		case r := <-decided:
			require.NoError(t, r.Err)
			require.Equal(t, res.EventID, r.EventID)
			require.Equal(t, txlog.RecoveryRepublished, r.Decision)
		case <-ctx.Done():
			t.Fatal("no recovery decision")
		}
		requireEventsOnTopic(ctx, t, b, "orders", res.EventID)
	})
}
