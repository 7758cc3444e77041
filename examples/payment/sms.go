package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/outbox"
)

// IdempotencyKeyHeader carries the command's idempotency key (the event id).
const IdempotencyKeyHeader = "Idempotency-Key"

// SMSGateway is the stub of an external SMS provider: a real HTTP server on
// 127.0.0.1 that records every call in sms_gateway_log by idempotency key.
// A key seen before is acknowledged without sending a second SMS. To show
// why the key matters it can "lose" the response of a first call: the SMS
// is recorded, but the caller gets a 503 and sends again.
type SMSGateway struct {
	DB  *sqlx.DB
	Log logrus.FieldLogger
	// LoseResponse reports whether the first call with key should get a 503
	// after the SMS was recorded. Default never.
	LoseResponse func(key string) bool

	Calls     atomic.Int64 // requests
	Delivered atomic.Int64 // new keys: SMS actually sent
	Resends   atomic.Int64 // known keys: absorbed, no second SMS
	Lost      atomic.Int64 // responses deliberately lost

	srv *http.Server
	url string
	wg  sync.WaitGroup
}

// Start listens on 127.0.0.1 (a random port) and serves in the background.
func (g *SMSGateway) Start() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("sms gateway: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /sms", g.handle)
	g.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	g.url = "http://" + ln.Addr().String() + "/sms"
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		_ = g.srv.Serve(ln)
	}()
	return nil
}

// URL is the send endpoint.
func (g *SMSGateway) URL() string { return g.url }

// Shutdown stops the server.
func (g *SMSGateway) Shutdown(ctx context.Context) error {
	if g.srv == nil {
		return nil
	}
	err := g.srv.Shutdown(ctx)
	g.wg.Wait()
	return err
}

type smsRequest struct {
	Phone string `json:"phone"`
	Body  string `json:"body"`
}

func (g *SMSGateway) handle(w http.ResponseWriter, r *http.Request) {
	g.Calls.Add(1)
	key := r.Header.Get(IdempotencyKeyHeader)
	var req smsRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || key == "" || req.Phone == "" || len(key) > 64 || len(req.Body) > 255 {
		http.Error(w, "want JSON {phone, body} and an Idempotency-Key header", http.StatusBadRequest)
		return
	}
	first, err := g.record(r.Context(), key, req, time.Now().UTC())
	if err != nil {
		g.Log.WithError(err).Warn("sms gateway: storage error")
		http.Error(w, "storage error", http.StatusInternalServerError)
		return
	}
	if !first {
		g.Resends.Add(1)
		writeJSON(w, http.StatusOK, map[string]string{"status": "duplicate", "key": key})
		return
	}
	g.Delivered.Add(1)
	if g.LoseResponse != nil && g.LoseResponse(key) {
		g.Lost.Add(1)
		http.Error(w, "upstream hiccup (the SMS went out, this answer is lost)", http.StatusServiceUnavailable)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "sent", "key": key})
}

// record counts a call by its idempotency key and reports whether it is the
// key's first: one upsert, no read before it.
func (g *SMSGateway) record(ctx context.Context, key string, req smsRequest, now time.Time) (bool, error) {
	if g.DB.DriverName() == "pgx" {
		// The row after the statement: a new key has calls = 1.
		var calls int
		err := g.DB.QueryRowxContext(ctx, `INSERT INTO sms_gateway_log (idempotency_key, phone, body, calls, first_at, last_at)
			VALUES ($1, $2, $3, 1, $4, $4)
			ON CONFLICT (idempotency_key) DO UPDATE SET calls = sms_gateway_log.calls + 1, last_at = EXCLUDED.last_at
			RETURNING calls`, key, req.Phone, req.Body, now).Scan(&calls)
		return calls == 1, err
	}
	res, err := g.DB.ExecContext(ctx, `INSERT INTO sms_gateway_log (idempotency_key, phone, body, calls, first_at, last_at)
		VALUES (?, ?, ?, 1, ?, ?) ON DUPLICATE KEY UPDATE calls = calls + 1, last_at = VALUES(last_at)`,
		key, req.Phone, req.Body, now, now)
	if err != nil {
		return false, err
	}
	// MySQL reports 1 affected row for an insert, 2 for an update.
	n, err := res.RowsAffected()
	return n == 1, err
}

// errRateLimited is returned (as a transient error) for a user over the limit.
var errRateLimited = errors.New("sms: per-user rate limit")

// UserLimiter is a per-user token bucket: at most Burst SMS at once and
// Every between SMS on average. It lives in the sender of the command
// outbox, so a throttled SMS is not dropped: its row is retried later.
type UserLimiter struct {
	Every time.Duration
	Burst int

	mu sync.Mutex
	m  map[int64]*rate.Limiter
}

// Allow reports whether user may get an SMS now, and takes a token if so.
func (l *UserLimiter) Allow(user int64, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[int64]*rate.Limiter{}
	}
	lim, ok := l.m[user]
	if !ok {
		lim = rate.NewLimiter(rate.Every(l.Every), l.Burst)
		l.m[user] = lim
	}
	return lim.AllowN(now, 1)
}

// SMSSender is the command outbox's sink: it sends one SMS command to the
// gateway with the row's event id as the idempotency key.
type SMSSender struct {
	URL     string
	Client  *http.Client
	Limiter *UserLimiter

	Attempts  atomic.Int64 // HTTP calls made
	Throttled atomic.Int64 // sends deferred by the rate limit
}

// Sink returns the FuncSink for an outbox dispatcher.
func (s *SMSSender) Sink() outbox.FuncSink { return s.send }

func (s *SMSSender) send(ctx context.Context, m *outbox.Message) error {
	var cmd SMSCommand
	if err := json.Unmarshal(m.Payload, &cmd); err != nil || cmd.Phone == "" {
		return outbox.Permanent(fmt.Errorf("sms: bad command %s: %v", m.EventID, err))
	}
	if s.Limiter != nil && !s.Limiter.Allow(cmd.UserID, time.Now()) {
		s.Throttled.Add(1)
		return outbox.NewSendError(outbox.ClassTransient, "rate_limited", errRateLimited)
	}
	body, _ := json.Marshal(smsRequest{Phone: cmd.Phone, Body: cmd.Body})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(body))
	if err != nil {
		return outbox.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(IdempotencyKeyHeader, m.IdempotencyKey())
	s.Attempts.Add(1)
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		// The request may have reached the gateway: unknown, send again
		// with the same key.
		return outbox.Unknown(fmt.Errorf("sms: %w", err))
	}
	_ = resp.Body.Close()
	return outbox.FromHTTPStatus(resp.StatusCode)
}
