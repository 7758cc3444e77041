package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"
)

// Driver plays the world around the service: users place orders, the
// payment gateway posts signed callbacks (some twice, some at the same
// moment, retrying on 503), some orders are canceled unpaid and then get a
// late callback, the producer restarts in the middle, and some events are
// delivered a second time.
type Driver struct {
	Svc    *Service
	URL    string // the callback endpoint
	Secret []byte
	Client *http.Client
	Log    logrus.FieldLogger
	RunID  string

	Payments, Users, Concurrency       int
	DupRate, CancelRate, RedeliverRate float64

	// Restart restarts the producer; called once, halfway (nil: never).
	Restart func(ctx context.Context) error
	// StartRelay starts the order service's outbox relay. The driver starts
	// it late, after the first quarter of the orders is paid and projected,
	// so their OrderCreated arrives after OrderPaid: out of order.
	StartRelay func(ctx context.Context) error
	// Redeliver publishes a committed event again with its original id.
	Redeliver func(ctx context.Context, eventID string) error
	// ProjectionPaid counts the orders the projection shows as PAID.
	ProjectionPaid func(ctx context.Context, orderIDs []string) (int, error)

	orders, paid, canceled, dups, rejected, bad, retried, redelivered, unexpected, early atomic.Int64
	restarted                                                                            atomic.Bool
}

// DriverStats is what the driver did.
type DriverStats struct {
	Orders       int // orders created
	Paid         int // payments confirmed by a 200 "applied" or "duplicate"
	Canceled     int // orders canceled unpaid
	DupCallbacks int // extra callbacks sent for already-sent ones
	Rejected     int // callbacks for canceled orders, answered 409 as expected
	BadRefused   int // forged, wrong-amount and unknown-payment callbacks refused as expected
	Retried503   int // callbacks sent again after a 503 or a connection error
	Redelivered  int // events published a second time
	Unexpected   int // answers the driver did not expect (should be 0)
	EarlyPaid    int // orders paid before the order relay started
	Restarted    bool
}

// Stats returns a snapshot.
func (d *Driver) Stats() DriverStats {
	return DriverStats{
		Orders: int(d.orders.Load()), Paid: int(d.paid.Load()), Canceled: int(d.canceled.Load()),
		DupCallbacks: int(d.dups.Load()), Rejected: int(d.rejected.Load()), BadRefused: int(d.bad.Load()), Retried503: int(d.retried.Load()),
		Redelivered: int(d.redelivered.Load()), Unexpected: int(d.unexpected.Load()), EarlyPaid: int(d.early.Load()),
		Restarted: d.restarted.Load(),
	}
}

type plannedOrder struct {
	OrderID, PaymentID string
	UserID, Amount     int64
	Cancel             bool
}

func newID(prefix string) string {
	id, err := uuid.NewV7()
	if err != nil {
		return prefix + uuid.NewString()
	}
	return prefix + id.String()
}

// Run drives the whole scenario. It returns when every callback has been
// answered and the redeliveries are published; the derived results catch
// up afterwards.
func (d *Driver) Run(ctx context.Context) error {
	if err := d.seedUsers(ctx); err != nil {
		return err
	}
	n := d.Payments
	var pays, cancels []plannedOrder
	for i := range n {
		pays = append(pays, plannedOrder{OrderID: newID("ord_"), PaymentID: newID("pay_"),
			UserID: int64(1 + i%d.Users), Amount: 500 + int64(i*7919%20000)})
	}
	for i := range int(math.Round(float64(n) * d.CancelRate)) {
		cancels = append(cancels, plannedOrder{OrderID: newID("ord_"), PaymentID: newID("pay_"),
			UserID: int64(1 + i%d.Users), Amount: 1000 + int64(i*31%5000), Cancel: true})
	}
	k := n / 4

	// Phase 1: the order relay is lagging. A quarter of the orders is paid;
	// their OrderPaid reaches the projection before their OrderCreated.
	d.Log.WithField("orders", k).Info("phase 1: paying the first orders while the order relay lags")
	if err := d.work(ctx, pays[:k], nil); err != nil {
		return err
	}
	d.early.Store(int64(k))
	ids := make([]string, k)
	for i, o := range pays[:k] {
		ids[i] = o.OrderID
	}
	if err := waitFor(ctx, 2*time.Minute, func() (bool, error) {
		got, err := d.ProjectionPaid(ctx, ids)
		return got == k, err
	}); err != nil {
		d.Log.WithError(err).Warn("phase 1: the projection did not show every early order as PAID; continuing")
	}
	if k > 0 {
		if err := d.badCallbacks(ctx, pays[0]); err != nil {
			return err
		}
	}
	if err := d.StartRelay(ctx); err != nil {
		return fmt.Errorf("start order relay: %w", err)
	}

	// Phase 2: everything else, with the producer restart halfway through.
	rest := append(append([]plannedOrder{}, pays[k:]...), cancels...)
	shuffle(rest, d.RunID)
	d.Log.WithFields(logrus.Fields{"payments": n - k, "canceled": len(cancels)}).Info("phase 2: order relay running; producer restart halfway")
	var restartErr error
	var restartWG sync.WaitGroup
	threshold := int64(k + (n-k)/2)
	onPaid := func() {
		if d.Restart != nil && d.paid.Load() >= threshold && d.restarted.CompareAndSwap(false, true) {
			restartWG.Add(1)
			go func() {
				defer restartWG.Done()
				restartErr = d.Restart(ctx)
			}()
		}
	}
	err := d.work(ctx, rest, onPaid)
	restartWG.Wait()
	if err != nil {
		return err
	}
	if restartErr != nil {
		return restartErr
	}

	// Phase 3: duplicates as the broker makes them (redelivery, double
	// commit, replay): the same event id and payload, published again.
	r := int(math.Round(float64(n) * d.RedeliverRate))
	if r > 0 {
		d.Log.WithField("events", r).Info("phase 3: delivering some PaymentSucceeded events a second time")
	}
	step := max(1, n/max(1, r))
	for i := 0; i < n && int(d.redelivered.Load()) < r; i += step {
		var eventID string
		if err := d.Svc.DB.GetContext(ctx, &eventID, d.Svc.DB.Rebind(`SELECT event_id FROM payments WHERE id = ?`), pays[i].PaymentID); err != nil {
			return fmt.Errorf("redeliver: %w", err)
		}
		if err := d.Redeliver(ctx, eventID); err != nil {
			return fmt.Errorf("redeliver %s: %w", eventID, err)
		}
		d.redelivered.Add(1)
	}
	return nil
}

func shuffle(xs []plannedOrder, seed string) {
	h := uuid.NewSHA1(idNamespace, []byte(seed))
	s := uint64(0)
	for _, b := range h[:8] {
		s = s<<8 | uint64(b)
	}
	for i := len(xs) - 1; i > 0; i-- {
		s ^= s << 13
		s ^= s >> 7
		s ^= s << 17
		j := int(s % uint64(i+1))
		xs[i], xs[j] = xs[j], xs[i]
	}
}

func (d *Driver) seedUsers(ctx context.Context) error {
	for i := 1; i <= d.Users; i++ {
		db := d.Svc.DB
		if _, err := db.ExecContext(ctx, db.Rebind(sqlFor(db.DriverName()).seedUser),
			i, fmt.Sprintf("user-%d", i), fmt.Sprintf("+1555%07d", i)); err != nil {
			return fmt.Errorf("seed users: %w", err)
		}
	}
	return nil
}

// work runs jobs on Concurrency workers.
func (d *Driver) work(ctx context.Context, jobs []plannedOrder, onPaid func()) error {
	ch := make(chan plannedOrder)
	var wg sync.WaitGroup
	var once sync.Once
	var firstErr error
	for range d.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for o := range ch {
				var err error
				if o.Cancel {
					err = d.cancelThenCallback(ctx, o)
				} else {
					err = d.pay(ctx, o)
					if err == nil && onPaid != nil {
						onPaid()
					}
				}
				if err != nil {
					once.Do(func() { firstErr = err })
				}
			}
		}()
	}
	for _, o := range jobs {
		select {
		case ch <- o:
		case <-ctx.Done():
		}
	}
	close(ch)
	wg.Wait()
	if firstErr == nil {
		firstErr = ctx.Err()
	}
	return firstErr
}

func (d *Driver) callbackFor(o plannedOrder) []byte {
	return mustJSON(Callback{PaymentID: o.PaymentID, OrderID: o.OrderID, AmountCents: o.Amount, Currency: "EUR",
		Status: PaymentSuccess, GatewayTxnID: "gw_" + shortID(o.PaymentID), PaidAt: time.Now().UTC().Format(time.RFC3339Nano)})
}

// pay creates the order and posts its callback; some callbacks are
// duplicated at the same moment and once more afterwards.
func (d *Driver) pay(ctx context.Context, o plannedOrder) error {
	if err := d.Svc.CreateOrder(ctx, o.OrderID, o.PaymentID, o.UserID, o.Amount, "EUR"); err != nil {
		return err
	}
	d.orders.Add(1)
	body := d.callbackFor(o)
	dup := pick("dup/"+o.PaymentID, d.DupRate)
	var wg sync.WaitGroup
	if dup {
		d.dups.Add(1)
		wg.Add(1)
		go func() { defer wg.Done(); d.expectOK(ctx, body) }()
	}
	ok := d.expectOK(ctx, body)
	wg.Wait()
	if dup {
		d.dups.Add(1)
		d.expectOK(ctx, body)
	}
	if ok {
		d.paid.Add(1)
	}
	return ctx.Err()
}

// cancelThenCallback creates an order, cancels it unpaid, then posts a
// late callback for it, which the service must refuse with 409.
func (d *Driver) cancelThenCallback(ctx context.Context, o plannedOrder) error {
	if err := d.Svc.CreateOrder(ctx, o.OrderID, o.PaymentID, o.UserID, o.Amount, "EUR"); err != nil {
		return err
	}
	d.orders.Add(1)
	if err := d.Svc.CancelOrder(ctx, o.OrderID); err != nil {
		return err
	}
	d.canceled.Add(1)
	status, resp, err := d.post(ctx, d.callbackFor(o))
	if err != nil {
		return err
	}
	if status == http.StatusConflict {
		d.rejected.Add(1)
	} else {
		d.unexpected.Add(1)
		d.Log.WithFields(logrus.Fields{"status": status, "code": resp.Code}).Error("late callback for a canceled order was not refused with 409")
	}
	return nil
}

// badCallbacks posts what an attacker or a broken gateway might: a forged
// signature, a wrong amount and an unknown payment. Each must be refused.
func (d *Driver) badCallbacks(ctx context.Context, o plannedOrder) error {
	body := d.callbackFor(o)
	wrongAmount := o
	wrongAmount.Amount++
	unknown := o
	unknown.PaymentID = newID("pay_unknown_")
	cases := []struct {
		body   []byte
		secret []byte
		want   int
	}{
		{body, []byte("forged-" + string(d.Secret)), http.StatusUnauthorized},
		{d.callbackFor(wrongAmount), d.Secret, http.StatusUnprocessableEntity},
		{d.callbackFor(unknown), d.Secret, http.StatusNotFound},
	}
	for _, c := range cases {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(c.body))
		if err != nil {
			return err
		}
		req.Header.Set(SignatureHeader, Sign(c.secret, c.body, time.Now()))
		resp, err := d.Client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode == c.want {
			d.bad.Add(1)
		} else {
			d.unexpected.Add(1)
			d.Log.WithField("status", resp.StatusCode).Errorf("bad callback not refused with %d", c.want)
		}
	}
	return nil
}

func (d *Driver) expectOK(ctx context.Context, body []byte) bool {
	status, resp, err := d.post(ctx, body)
	if err == nil && status == http.StatusOK {
		return true
	}
	d.unexpected.Add(1)
	d.Log.WithFields(logrus.Fields{"status": status, "code": resp.Code, "error": resp.Error}).WithError(err).Error("callback not accepted")
	return false
}

// post sends one signed callback, retrying on 503 and connection errors as
// a payment gateway does.
func (d *Driver) post(ctx context.Context, body []byte) (int, CallbackResponse, error) {
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		status, resp, err := d.postOnce(ctx, body)
		if err == nil && status != http.StatusServiceUnavailable {
			return status, resp, nil
		}
		if attempt >= 100 || ctx.Err() != nil {
			if err == nil {
				err = fmt.Errorf("still %d after %d attempts: %s", status, attempt, resp.Error)
			}
			return status, resp, err
		}
		d.retried.Add(1)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

func (d *Driver) postOnce(ctx context.Context, body []byte) (int, CallbackResponse, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL, bytes.NewReader(body))
	if err != nil {
		return 0, CallbackResponse{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign(d.Secret, body, time.Now()))
	resp, err := d.Client.Do(req)
	if err != nil {
		return 0, CallbackResponse{}, err
	}
	defer resp.Body.Close()
	var cr CallbackResponse
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &cr)
	return resp.StatusCode, cr, nil
}

// waitFor polls cond until it holds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("condition not met within %s", timeout)
			}
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}
