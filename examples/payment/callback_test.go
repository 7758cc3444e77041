package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

type callbackBundle struct {
	db     *sqlx.DB
	svc    *Service
	srv    *httptest.Server
	secret []byte
	topic  string
}

// setupCallback runs the payment service with a real transactional
// producer on db and a fresh topic.
func setupCallback(t *testing.T, db *sqlx.DB) *callbackBundle {
	t.Helper()
	s := testenv.Integration(t)
	ctx := context.Background()
	require.NoError(t, Migrate(ctx, db))
	topic := testenv.Name(t, "pay")
	testenv.CreateTopic(t, topic, 4)
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{s.NameServer}, Group: testenv.Name(t, "ptx"), DB: db, TablePrefix: rmqtxPrefix,
		FenceAge: 4 * time.Second, LocalTxTimeout: 3 * time.Second, WarmupTopics: []string{topic},
	})
	require.NoError(t, err)
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	payT, _ := outbox.NewTable(payOutboxPrefix)
	ordT, _ := outbox.NewTable(orderOutboxPrefix)
	b := &callbackBundle{db: db, secret: []byte("test-secret"), topic: topic}
	l, _, _ := newLoggers(testWriter{t}, false)
	b.svc = &Service{DB: db, Secret: b.secret, PaymentTopic: topic, OrderTopic: topic + "_order",
		PayOutbox: payT, OrderOutbox: ordT, Log: l}
	b.svc.SetProducer(p)
	b.srv = httptest.NewServer(b.svc.Handler())
	t.Cleanup(b.srv.Close)
	_, err = db.Exec(`INSERT INTO users (id, name, phone) VALUES (1, 'ann', '+15550000001')`)
	require.NoError(t, err)
	return b
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (b *callbackBundle) post(t *testing.T, body []byte, signature string) (int, CallbackResponse) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+CallbackPath, bytes.NewReader(body))
	require.NoError(t, err)
	if signature != "" {
		req.Header.Set(SignatureHeader, signature)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var cr CallbackResponse
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&cr))
	return resp.StatusCode, cr
}

// snapshot dumps every row of every table of the database: "nothing
// changed" is checked on the whole database, rmqtx's tables included.
func snapshot(t *testing.T, db *sqlx.DB) string {
	t.Helper()
	var tables []string
	schemaExpr, quote := "DATABASE()", "`"
	if engineOf(db) == EnginePostgres {
		schemaExpr, quote = "current_schema()", `"`
	}
	require.NoError(t, db.Select(&tables, `SELECT table_name FROM information_schema.tables WHERE table_schema = `+schemaExpr+` ORDER BY table_name`))
	require.Contains(t, tables, "payments")
	require.Contains(t, tables, "rmqtx_txlog")
	var b strings.Builder
	for _, tbl := range tables {
		rows, err := db.Queryx("SELECT * FROM " + quote + tbl + quote)
		require.NoError(t, err)
		var lines []string
		for rows.Next() {
			m := map[string]any{}
			require.NoError(t, rows.MapScan(m))
			keys := make([]string, 0, len(m))
			for k := range m {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var l strings.Builder
			for _, k := range keys {
				v := m[k]
				if bs, ok := v.([]byte); ok {
					v = string(bs)
				}
				fmt.Fprintf(&l, "%s=%v;", k, v)
			}
			lines = append(lines, l.String())
		}
		require.NoError(t, rows.Err())
		_ = rows.Close()
		sort.Strings(lines)
		fmt.Fprintf(&b, "## %s (%d rows)\n%s\n", tbl, len(lines), strings.Join(lines, "\n"))
	}
	return b.String()
}

func TestCallbackRejectsBadRequestsAndChangesNothing(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testCallbackRejectsBadRequests)
}

func testCallbackRejectsBadRequests(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	b := setupCallback(t, db)
	ctx := context.Background()
	require.NoError(t, b.svc.CreateOrder(ctx, "ord_1", "pay_1", 1, 12_345, "EUR"))
	require.NoError(t, b.svc.CreateOrder(ctx, "ord_2", "pay_2", 1, 500, "EUR"))
	require.NoError(t, b.svc.CancelOrder(ctx, "ord_2"))

	good := Callback{PaymentID: "pay_1", OrderID: "ord_1", AmountCents: 12_345, Currency: "EUR", Status: PaymentSuccess,
		GatewayTxnID: "gw_1", PaidAt: time.Now().UTC().Format(time.RFC3339Nano)}
	with := func(f func(*Callback)) []byte {
		c := good
		f(&c)
		return mustJSON(c)
	}
	sign := func(body []byte) string { return Sign(b.secret, body, time.Now()) }
	goodBody := mustJSON(good)

	cases := []struct {
		name   string
		body   []byte
		sig    string
		status int
		code   string
	}{
		{"forged signature", goodBody, Sign([]byte("not-the-secret"), goodBody, time.Now()), http.StatusUnauthorized, "bad_signature"},
		{"signature of another body", with(func(c *Callback) { c.AmountCents = 1 }), sign(goodBody), http.StatusUnauthorized, "bad_signature"},
		{"no signature", goodBody, "", http.StatusUnauthorized, "bad_signature"},
		{"replayed old signature", goodBody, Sign(b.secret, goodBody, time.Now().Add(-time.Hour)), http.StatusUnauthorized, "bad_signature"},
		{"wrong amount", with(func(c *Callback) { c.AmountCents = 12_344 }), "", http.StatusUnprocessableEntity, "amount_mismatch"},
		{"wrong currency", with(func(c *Callback) { c.Currency = "USD" }), "", http.StatusUnprocessableEntity, "amount_mismatch"},
		{"unknown payment", with(func(c *Callback) { c.PaymentID = "pay_nope" }), "", http.StatusNotFound, "unknown_payment"},
		{"order mismatch", with(func(c *Callback) { c.OrderID = "ord_2" }), "", http.StatusUnprocessableEntity, "order_mismatch"},
		{"gateway status not success", with(func(c *Callback) { c.Status = "FAILED" }), "", http.StatusUnprocessableEntity, "unsupported_status"},
		{"malformed body", []byte(`{"payment_id":`), "", http.StatusBadRequest, "bad_body"},
		{"canceled order", with(func(c *Callback) { c.PaymentID, c.OrderID, c.AmountCents = "pay_2", "ord_2", 500 }), "", http.StatusConflict, "payment_canceled"},
	}
	before := snapshot(t, b.db)
	for _, tc := range cases {
		sig := tc.sig
		if sig == "" && tc.name != "no signature" {
			sig = sign(tc.body)
		}
		status, resp := b.post(t, tc.body, sig)
		require.Equal(t, tc.status, status, "%s: %+v", tc.name, resp)
		require.Equal(t, tc.code, resp.Code, tc.name)
		require.NotEmpty(t, resp.Error, "%s: a clear error message", tc.name)
		require.Empty(t, resp.Result, tc.name)
		t.Logf("%-28s -> %d %s: %s", tc.name, status, resp.Code, resp.Error)
	}
	require.Equal(t, before, snapshot(t, b.db), "rejected callbacks changed the database")
	require.EqualValues(t, len(cases), b.svc.Stats.Rejected.Load())

	// Positive control: the genuine callback applies, once.
	coll := testenv.Collect(t, b.topic)
	status, resp := b.post(t, goodBody, sign(goodBody))
	require.Equal(t, http.StatusOK, status, "%+v", resp)
	require.Equal(t, "applied", resp.Result)
	require.Equal(t, paymentEventID("pay_1"), resp.EventID)
	var st struct {
		Pay   string `db:"pay"`
		Order string `db:"ord"`
		Ver   int    `db:"ver"`
	}
	require.NoError(t, b.db.Get(&st, `SELECT p.status pay, o.status ord, o.version ver FROM payments p JOIN orders o ON o.id = p.order_id WHERE p.id = 'pay_1'`))
	require.Equal(t, PaymentSuccess, st.Pay)
	require.Equal(t, OrderPaid, st.Order)
	require.Equal(t, VersionPaid, st.Ver)
	store, err := txlog.New(b.db, rmqtxPrefix)
	require.NoError(t, err)
	row, err := store.Get(context.Background(), resp.EventID)
	require.NoError(t, err)
	require.Equal(t, txlog.StateCommitted, row.State)
	payT, _ := outbox.NewTable(payOutboxPrefix)
	paid, err := payT.Get(context.Background(), b.db, EventID(TypeOrderPaid, "ord_1"))
	require.NoError(t, err, "OrderPaid enqueued in the same transaction")
	require.EqualValues(t, VersionPaid, paid.AggregateVersion)
	coll.WaitDistinct(t, 1, time.Minute)
	require.Equal(t, 1, coll.Snapshot().Counts[resp.EventID], "PaymentSucceeded delivered")

	// A repeated callback is a no-op: same answer, nothing written.
	after := snapshot(t, b.db)
	for range 3 {
		status, resp = b.post(t, goodBody, sign(goodBody))
		require.Equal(t, http.StatusOK, status)
		require.Equal(t, "duplicate", resp.Result)
		require.Equal(t, paymentEventID("pay_1"), resp.EventID)
	}
	require.Equal(t, after, snapshot(t, b.db), "a repeated callback changed the database")
	// A second gateway transaction for a paid payment is a conflict.
	status, resp = b.post(t, with(func(c *Callback) { c.GatewayTxnID = "gw_other" }), sign(with(func(c *Callback) { c.GatewayTxnID = "gw_other" })))
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "already_paid", resp.Code)
	require.Equal(t, after, snapshot(t, b.db))
	require.EqualValues(t, 1, b.svc.Stats.Applied.Load())
	require.EqualValues(t, 3, b.svc.Stats.Duplicates.Load())
}

// A callback whose Send fails is answered 503, and the gateway's retry
// publishes with the same event id: the failed Send committed nothing and
// did not spend the payment's one id. The failure is real: the order row is
// locked by another transaction, so the callback's local transaction runs
// past LocalTxTimeout and rolls back.
func TestCallbackRetrySendsTheSameEventID(t *testing.T) {
	t.Parallel()
	testenv.EachDB(t, testCallbackRetrySameID)
}

func testCallbackRetrySameID(t *testing.T, db *sqlx.DB) {
	t.Parallel()
	b := setupCallback(t, db)
	ctx := context.Background()
	require.NoError(t, b.svc.CreateOrder(ctx, "ord_1", "pay_1", 1, 12_345, "EUR"))
	body := mustJSON(Callback{PaymentID: "pay_1", OrderID: "ord_1", AmountCents: 12_345, Currency: "EUR", Status: PaymentSuccess,
		GatewayTxnID: "gw_1", PaidAt: time.Now().UTC().Format(time.RFC3339Nano)})
	id := paymentEventID("pay_1")
	coll := testenv.Collect(t, b.topic)

	lock, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	var ver int
	require.NoError(t, lock.Get(&ver, db.Rebind(`SELECT version FROM orders WHERE id = ? FOR UPDATE`), "ord_1"))
	status, resp := b.post(t, body, Sign(b.secret, body, time.Now()))
	require.NoError(t, lock.Rollback())
	require.Equal(t, http.StatusServiceUnavailable, status, "%+v", resp)
	require.EqualValues(t, 1, b.svc.Stats.Unavailable.Load())
	var pay string
	require.NoError(t, db.Get(&pay, db.Rebind(`SELECT status FROM payments WHERE id = ?`), "pay_1"))
	require.Equal(t, PaymentPending, pay, "the failed Send committed nothing")
	store, err := txlog.New(db, rmqtxPrefix)
	require.NoError(t, err)
	if row, err := store.Get(ctx, id); err == nil {
		require.Equal(t, txlog.StateRolledBack, row.State, "the failed Send's row records its rollback")
	} else {
		require.ErrorIs(t, err, txlog.ErrNotFound)
	}

	// The gateway's retry: the same id, applied.
	status, resp = b.post(t, body, Sign(b.secret, body, time.Now()))
	require.Equal(t, http.StatusOK, status, "%+v", resp)
	require.Equal(t, "applied", resp.Result)
	require.Equal(t, id, resp.EventID)
	row, err := store.Get(ctx, id)
	require.NoError(t, err)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.NoError(t, db.Get(&pay, db.Rebind(`SELECT status FROM payments WHERE id = ?`), "pay_1"))
	require.Equal(t, PaymentSuccess, pay)
	coll.WaitDistinct(t, 1, time.Minute)
	require.Equal(t, 1, coll.Snapshot().Counts[id], "PaymentSucceeded delivered once, with the payment's id")
	// Once more: a duplicate of the same id.
	status, resp = b.post(t, body, Sign(b.secret, body, time.Now()))
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "duplicate", resp.Result)
	require.Equal(t, id, resp.EventID)
}
