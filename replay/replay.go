package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/shutdown"
	"github.com/rmqtx/rmqtx/metrics"
	"github.com/rmqtx/rmqtx/wire"
)

// Result is how a replay run ended; it is stored in replay_audit.result.
type Result string

// Run results.
const (
	ResultRunning   Result = "RUNNING"   // in progress (or the process died: finished_at stays NULL)
	ResultCompleted Result = "COMPLETED" // every selected dead letter was sent or skipped
	ResultPartial   Result = "PARTIAL"   // finished, but some sends failed (they stay PARKED)
	ResultStopped   Result = "STOPPED"   // stopped by the new-dead-letter threshold
	ResultCanceled  Result = "CANCELED"  // the context ended
	ResultFailed    Result = "FAILED"    // a database error ended the run
	ResultEmpty     Result = "EMPTY"     // nothing selected
)

// Item results.
const (
	ItemSent    = "sent"
	ItemFailed  = "failed"
	ItemSkipped = "skipped"
)

// Request is one replay run.
type Request struct {
	Selector Selector
	// Operator and Reason are required: they go to the audit row (and the
	// operator into each message's PropOperator).
	Operator string
	Reason   string
	// Rate overrides Config.Rate (messages per second) when > 0.
	Rate float64
	// Batch overrides Config.Batch when > 0.
	Batch int
}

// Item is what happened to one dead letter.
type Item struct {
	DeadLetterID  int64     `json:"dead_letter_id"`
	ConsumerGroup string    `json:"consumer_group"`
	Topic         string    `json:"topic"`
	EventID       string    `json:"event_id"`
	Result        string    `json:"result"` // sent, failed, skipped
	Detail        string    `json:"detail,omitempty"`
	MsgID         string    `json:"msg_id,omitempty"`
	SentAt        time.Time `json:"sent_at,omitzero"` // when the send returned OK (replayer's clock)
	// ErrorClass and ErrorCode classify a failed send (errclass): the
	// broker's answer (Transient "topic_not_exist", Permanent
	// "message_illegal", ...), Unknown "timeout", or Unknown for anything
	// else. Set in the Report only, for a failed send; the audit row's
	// detail names the answer in its text.
	ErrorClass errclass.Class `json:"error_class,omitempty"`
	ErrorCode  string         `json:"error_code,omitempty"`
}

// Report is the outcome of Replay; it mirrors the audit row.
type Report struct {
	AuditID        int64     `json:"audit_id"`
	Result         Result    `json:"result"`
	Selected       int       `json:"selected"`
	Sent           int       `json:"sent"`
	Failed         int       `json:"failed"`
	Skipped        int       `json:"skipped"`
	NewDeadLetters int       `json:"new_dead_letters"`
	Rate           float64   `json:"rate"`
	Batch          int       `json:"batch"`
	StartedAt      time.Time `json:"started_at"`
	FinishedAt     time.Time `json:"finished_at"`
	Items          []Item    `json:"items"`
}

type tables struct {
	audit, item string
}

// Replayer replays dead letters. Create it with New; DryRun and Migrate work
// at once, Replay needs Start. It is safe for concurrent use; concurrent
// runs never send the same dead letter twice.
type Replayer struct {
	cfg  Config
	t    tables
	d    dialect.Dialect
	dead *consumer.DeadLetterStore // the consumer's dead letters: selection, lock, resolution
	tr   *otelx.Tracer             // nil: tracing off

	mu      sync.Mutex
	prod    broker.Producer
	started bool
	closed  bool
}

// New validates cfg (after WithDefaults) and returns a Replayer. It does not
// connect to the broker: Start does.
func New(cfg Config) (*Replayer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dead, err := consumer.NewDeadLetterStore(cfg.DB, cfg.TablePrefix)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	t, err := newTables(cfg.TablePrefix)
	if err != nil {
		return nil, err
	}
	d, err := dialect.For(cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return &Replayer{cfg: cfg, d: d, dead: dead, t: t, tr: otelx.New(cfg.TracerProvider)}, nil
}

// Config returns the configuration with defaults applied.
func (r *Replayer) Config() Config { return r.cfg }

// Start creates and starts the replayer's producer. It is idempotent; after
// Shutdown it returns ErrClosed.
func (r *Replayer) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if r.started {
		return nil
	}
	if len(r.cfg.NameServers) == 0 {
		return fmt.Errorf("%w: NameServers is required to replay", ErrConfig)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("replay: start: %w", err)
	}
	rmqlog.Install(r.cfg.Logger)
	p, err := broker.NewProducer(broker.ProducerConfig{
		NameServers:  r.cfg.NameServers,
		Group:        r.cfg.Group,
		InstanceName: r.cfg.InstanceName,
		SendTimeout:  r.cfg.SendTimeout,
		Retries:      2,
		// The queue of the event's aggregate (replayMessage sets the key),
		// as the original sender chose it.
		Selector: rmqroute.New(),
	})
	if err != nil {
		return fmt.Errorf("replay: producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return fmt.Errorf("replay: start producer: %w", err)
	}
	r.prod, r.started = p, true
	return nil
}

// Shutdown stops the producer. It is idempotent. A Replay in progress fails
// its remaining sends; cancel its context first to end it cleanly.
func (r *Replayer) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	if r.prod == nil {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- r.prod.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("replay: shutdown: %w", err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("replay: shutdown: %w", ctx.Err())
	}
}

// Close is Shutdown bounded by shutdown.DefaultCloseTimeout (30 s), the
// bound every rmqtx Close shares.
func (r *Replayer) Close() error { return shutdown.Close(r.Shutdown) }

func (r *Replayer) producer() (broker.Producer, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.closed:
		return nil, ErrClosed
	case !r.started:
		return nil, ErrNotStarted
	}
	return r.prod, nil
}

// Replay re-publishes the dead letters req.Selector picks, under the rate
// limit, in batches, and audits the run. It returns the report (also on
// error, as far as it got); err is non-nil only when the run could not be
// audited or a database error ended it. A STOPPED or PARTIAL run is not an
// error: read Report.Result.
func (r *Replayer) Replay(ctx context.Context, req Request) (Report, error) {
	if strings.TrimSpace(req.Operator) == "" || strings.TrimSpace(req.Reason) == "" {
		return Report{}, fmt.Errorf("%w: operator and reason are required", ErrRequest)
	}
	if req.Selector.Empty() {
		return Report{}, fmt.Errorf("%w: the selector selects every dead letter; name ids, a group, a type, a key, a class or a time range", ErrRequest)
	}
	if req.Rate < 0 || req.Batch < 0 {
		return Report{}, fmt.Errorf("%w: rate and batch must not be negative", ErrRequest)
	}
	prod, err := r.producer()
	if err != nil {
		return Report{}, err
	}
	rep := Report{Rate: r.cfg.Rate, Batch: r.cfg.Batch}
	if req.Rate > 0 {
		rep.Rate = req.Rate
	}
	if req.Batch > 0 {
		rep.Batch = req.Batch
	}
	scope, _ := json.Marshal(req.Selector)

	// The start time comes from the database clock: new dead letters are
	// stamped by it.
	if err := r.cfg.DB.GetContext(ctx, &rep.StartedAt, "SELECT "+r.d.Now()); err != nil {
		return rep, fmt.Errorf("replay: read clock: %w", err)
	}
	rep.StartedAt = rep.StartedAt.UTC()
	rep.AuditID, err = r.d.InsertID(ctx, r.cfg.DB, r.d.Rebind("INSERT INTO "+r.t.audit+
		" (operator, reason, scope, rate_limit, batch_size, result, started_at) VALUES (?, ?, ?, ?, ?, ?, ?)"), "id",
		clip(req.Operator, 128), clip(req.Reason, 1024), string(scope), rep.Rate, rep.Batch, string(ResultRunning), rep.StartedAt)
	if err != nil {
		return rep, fmt.Errorf("replay: write audit row: %w", err)
	}
	log := r.cfg.Logger.WithField("audit_id", rep.AuditID).WithField("operator", req.Operator)

	if r.cfg.Metrics != nil {
		r.cfg.Metrics.ReplayRate.Set(rep.Rate)
		defer r.cfg.Metrics.ReplayRate.Set(0)
	}
	runErr := r.run(ctx, prod, req, &rep)
	switch {
	case runErr == nil:
	case errors.Is(runErr, context.Canceled), errors.Is(runErr, context.DeadlineExceeded):
		rep.Result = ResultCanceled
	default:
		rep.Result = ResultFailed
	}
	// Finish the audit row even when ctx is done.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var errText any
	if runErr != nil {
		errText = clip(runErr.Error(), 2000)
	}
	if err := fctx.Err(); err == nil {
		_ = r.cfg.DB.GetContext(fctx, &rep.FinishedAt, "SELECT "+r.d.Now())
	}
	rep.FinishedAt = rep.FinishedAt.UTC()
	if _, err := r.cfg.DB.ExecContext(fctx, r.d.Rebind("UPDATE "+r.t.audit+" SET selected = ?, sent = ?, failed = ?, skipped = ?,"+
		" new_dead_letters = ?, result = ?, error_text = ?, finished_at = ? WHERE id = ?"),
		rep.Selected, rep.Sent, rep.Failed, rep.Skipped, rep.NewDeadLetters, string(rep.Result), errText, rep.FinishedAt, rep.AuditID); err != nil {
		return rep, errors.Join(runErr, fmt.Errorf("replay: finish audit row %d: %w", rep.AuditID, err))
	}
	log.WithField("result", rep.Result).WithField("sent", rep.Sent).WithField("failed", rep.Failed).
		WithField("skipped", rep.Skipped).Info("replay: finished")
	if runErr != nil && rep.Result == ResultFailed {
		return rep, runErr
	}
	return rep, nil
}

func (r *Replayer) run(ctx context.Context, prod broker.Producer, req Request, rep *Report) error {
	cs, err := r.selectCandidates(ctx, req.Selector)
	if err != nil {
		return err
	}
	rep.Selected = len(cs)
	if len(cs) == 0 {
		rep.Result = ResultEmpty
		return nil
	}
	if _, err := r.cfg.DB.ExecContext(ctx, r.d.Rebind("UPDATE "+r.t.audit+" SET selected = ? WHERE id = ?"), rep.Selected, rep.AuditID); err != nil {
		return fmt.Errorf("replay: audit: %w", err)
	}
	lim := rate.NewLimiter(rate.Limit(rep.Rate), 1)
	for start, batch := 0, 1; start < len(cs); start, batch = start+rep.Batch, batch+1 {
		end := min(start+rep.Batch, len(cs))
		for _, c := range cs[start:end] {
			if err := ctx.Err(); err != nil {
				return err
			}
			it := Item{DeadLetterID: c.DeadLetterID, ConsumerGroup: c.ConsumerGroup, Topic: c.Topic, EventID: c.EventID}
			if c.Action != "replay" {
				it.Result, it.Detail = ItemSkipped, c.SkipReason
			} else {
				if err := lim.Wait(ctx); err != nil {
					return err
				}
				if err := r.replayOne(ctx, prod, req, rep.AuditID, &it); err != nil {
					return err
				}
			}
			r.record(ctx, rep, it)
		}
		if r.cfg.Test.AfterBatch != nil {
			r.cfg.Test.AfterBatch(batch)
		}
		n, err := r.newDeadLetters(ctx, req.Selector.ConsumerGroup, rep.StartedAt)
		if err != nil {
			return err
		}
		rep.NewDeadLetters = n
		if _, err := r.cfg.DB.ExecContext(ctx, r.d.Rebind("UPDATE "+r.t.audit+" SET sent = ?, failed = ?, skipped = ?, new_dead_letters = ? WHERE id = ?"),
			rep.Sent, rep.Failed, rep.Skipped, n, rep.AuditID); err != nil {
			return fmt.Errorf("replay: audit progress: %w", err)
		}
		if r.cfg.StopAfterNewDeadLetters > 0 && n >= r.cfg.StopAfterNewDeadLetters && end < len(cs) {
			rep.Result = ResultStopped
			r.cfg.Logger.WithField("audit_id", rep.AuditID).WithField("new_dead_letters", n).
				Warn("replay: stopped: new dead letters passed the threshold")
			return nil
		}
	}
	rep.Result = ResultCompleted
	if rep.Failed > 0 {
		rep.Result = ResultPartial
	}
	return nil
}

// record counts an item, stores its audit row and its metric.
func (r *Replayer) record(ctx context.Context, rep *Report, it Item) {
	switch it.Result {
	case ItemSent:
		rep.Sent++
	case ItemFailed:
		rep.Failed++
	default:
		rep.Skipped++
	}
	rep.Items = append(rep.Items, it)
	metrics.Inc(r.cfg.Metrics, func(m *metrics.Metrics) *prometheus.CounterVec { return m.ReplayMessages }, it.Topic, it.Result)
	if it.Result == ItemSent {
		return // written in the send transaction
	}
	d := r.d
	if _, err := r.cfg.DB.ExecContext(ctx, d.Rebind(d.Upsert(r.t.item,
		"audit_id, dead_letter_id, consumer_group, event_id, topic, result, msg_id, detail, at", "?, ?, ?, ?, ?, ?, ?, ?, "+d.Now(),
		"audit_id, dead_letter_id",
		"result = "+d.Excluded("result")+", detail = "+d.Excluded("detail")+", at = "+d.Excluded("at"))),
		rep.AuditID, it.DeadLetterID, clip(it.ConsumerGroup, 255), clip(it.EventID, 128), clip(it.Topic, 255), it.Result, clip(it.MsgID, 128), clip(it.Detail, 512)); err != nil {
		r.cfg.Logger.WithError(err).WithField("dead_letter_id", it.DeadLetterID).Warn("replay: cannot write audit item")
	}
}

// replayOne sends one dead letter inside a transaction that holds its row
// lock, and marks it REPLAYED in the same transaction. A send failure leaves
// the row as it was (rolled back) and is reported in it, not as an error; a
// database error before the send is returned.
func (r *Replayer) replayOne(ctx context.Context, prod broker.Producer, req Request, auditID int64, it *Item) error {
	tx, err := r.cfg.DB.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("replay: begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	l, err := r.dead.GetForUpdate(ctx, tx, it.DeadLetterID)
	if errors.Is(err, consumer.ErrNotFound) {
		it.Result, it.Detail = ItemSkipped, "dead letter no longer exists"
		return nil
	}
	if err != nil {
		return fmt.Errorf("replay: lock dead letter %d: %w", it.DeadLetterID, err)
	}
	if reason := lockedSkipReason(l, req.Selector); reason != "" {
		it.Result, it.Detail = ItemSkipped, reason
		return nil
	}
	props := replayProperties(l)
	props[PropAuditID] = strconv.FormatInt(auditID, 10)
	props[PropOperator] = clip(req.Operator, 128)
	props[PropCount] = strconv.Itoa(l.ReplayCount + 1)
	props[PropDeadLetterID] = strconv.FormatInt(l.ID, 10)
	props[PropGroup] = l.ConsumerGroup
	sctx, sp := r.tr.StartLinked(ctx, props, otelx.SpanReplay, trace.SpanKindProducer,
		otelx.Attrs{Destination: l.Topic, Group: r.cfg.Group, EventID: l.EventID, EventType: l.EventType})
	r.tr.Inject(sctx, props)
	msg := replayMessage(l, props)

	sctx, cancel := context.WithTimeout(sctx, r.cfg.SendTimeout)
	res, err := prod.SendSync(sctx, msg)
	cancel()
	sp.EndSend(res, err)
	if err == nil {
		err = broker.CheckSendResult(res) // stored with a non-OK status, or no result
	}
	if err != nil {
		// The result may be unknown (a timeout): the message may have gone.
		// Harmless: the consumer dedups, and the row stays replayable. The
		// detail names the broker's answer as every sender does
		// (internal/broker/brokerclass): a missing topic says to create it.
		detail := "send: " + err.Error()
		if d := brokerclass.Describe(err); d != "" {
			detail = "send (" + d + "): " + err.Error()
		}
		it.Result, it.Detail = ItemFailed, clip(detail, 512)
		f := sendFailure(err)
		it.ErrorClass, it.ErrorCode = f.Class, f.ErrorCode()
		return nil
	}
	it.MsgID = res.MsgID
	it.SentAt = time.Now().UTC()
	note := fmt.Sprintf("replayed by %s (audit %d)", clip(req.Operator, 128), auditID)
	err = r.dead.MarkReplayedTx(ctx, tx, l.ID, note)
	if err == nil {
		_, err = tx.ExecContext(ctx, r.d.Rebind("INSERT INTO "+r.t.item+
			" (audit_id, dead_letter_id, consumer_group, event_id, topic, result, msg_id, detail, at) VALUES (?, ?, ?, ?, ?, ?, ?, '', "+r.d.Now()+")"),
			auditID, l.ID, clip(l.ConsumerGroup, 255), clip(l.EventID, 128), clip(l.Topic, 255), ItemSent, clip(res.MsgID, 128))
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		// Sent but not recorded: the row stays as it was; a later replay is
		// absorbed by the consumer's dedup.
		it.Result, it.Detail = ItemFailed, clip("sent but not recorded: "+err.Error(), 512)
		return nil
	}
	it.Result = ItemSent
	return nil
}

// replayMessage is the message that re-publishes l with props (its stored
// properties and the replay's own). Its sharding key is the envelope's
// routing key (aggregate, else business key: wire.RoutingKey), so the
// replayer's selector sends it to the queue wire.QueueFor picks, the queue
// of the aggregate's other events (WIRE.md, "Queue routing").
func replayMessage(l consumer.DeadLetter, props map[string]string) *broker.Message {
	msg := broker.NewMessage(l.Topic, l.Payload)
	msg.WithProperties(props)
	if k := wire.PropertiesRoutingKey(props); k != "" {
		msg.WithShardingKey(k)
	}
	return msg
}

// newDeadLetters counts dead letters parked (first time or again) since t.
func (r *Replayer) newDeadLetters(ctx context.Context, group string, since time.Time) (int, error) {
	n, err := r.dead.CountFilter(ctx, consumer.DeadLetterFilter{Status: consumer.DeadLetterParked, ConsumerGroup: group, LastSeenSince: since})
	if err != nil {
		return 0, fmt.Errorf("replay: count new dead letters: %w", err)
	}
	return n, nil
}

// clip cuts s to at most n bytes on a rune boundary (columns are utf8mb4).
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
