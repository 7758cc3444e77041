package txproducer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/discard"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/propjson"
	"github.com/rmqtx/rmqtx/internal/shutdown"
	"github.com/rmqtx/rmqtx/internal/workerpool"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// firstHeartbeat is when rocketmq-client-go sends its first heartbeat after
// Start (then every 30 s). Warm-up heartbeats itself (see warmup.go) and
// waits for this one only when it cannot.
const firstHeartbeat = time.Second

type lifecycle int

const (
	stateNew lifecycle = iota
	stateStarted
	stateClosed
)

// Producer is a transactional producer. Create it with New, call Start,
// Send from any number of goroutines, and Shutdown.
type Producer struct {
	cfg      Config
	db       *sqlx.DB
	log      *txlog.Store
	checker  *checkback.Checker
	recovery *discard.Recovery
	ender    *ender           // ends keyed commits synchronously (endsync.go)
	tr       *otelx.Tracer    // nil: tracing off
	overlap  *workerpool.Pool // runs each Send's early transaction (begin)

	mu       sync.Mutex
	state    lifecycle
	tp       broker.TxProducer
	brokers  *watcher // nil: not watching (see rejoin.go)
	inflight sync.WaitGroup
	calls    sync.Map // *broker.Message -> *call
}

// New validates cfg and returns a Producer that is not started.
func New(cfg Config) (*Producer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	store, err := cfg.store()
	if err != nil {
		return nil, err
	}
	db := cfg.DB
	if db == nil {
		db = store.DB()
	}
	checker, err := checkback.New(checkback.Config{
		Log: store, Group: cfg.Group, FenceAge: cfg.FenceAge, QueryTimeout: cfg.CheckTimeout,
		Resolver: cfg.Resolver, OnAnswer: cfg.OnCheck, Observe: cfg.Observe,
	})
	if err != nil {
		return nil, fmt.Errorf("txproducer: %w", err)
	}
	p := &Producer{cfg: cfg, db: db, log: store, checker: checker, tr: otelx.New(cfg.TracerProvider),
		ender: newEnder(cfg.NameServers, cfg.Group, cfg.SendTimeout), overlap: workerpool.New(overlapWorkers)}
	if !cfg.DisableRecovery {
		p.recovery, err = discard.New(discard.Config{
			NameServers: cfg.NameServers, Group: cfg.Group, Log: store,
			InstanceName: cfg.InstanceName + "-recovery", StartRetry: cfg.RecoveryStartRetry,
			SendTimeout: cfg.SendTimeout, QueryTimeout: cfg.CheckTimeout,
			OnDecision: cfg.OnRecovery, Observe: cfg.Observe,
		})
		if err != nil {
			return nil, fmt.Errorf("txproducer: %w", err)
		}
	}
	return p, nil
}

// Log returns the transaction log the producer writes.
func (p *Producer) Log() *txlog.Store { return p.log }

// InstanceName returns the client instance name of this lifecycle.
func (p *Producer) InstanceName() string { return p.cfg.InstanceName }

// start is Start (see startcheck.go) without its error wrapping.
func (p *Producer) start(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch p.state {
	case stateStarted:
		return nil
	case stateClosed:
		return ErrClosed
	}
	if err := p.checkReachable(ctx); err != nil {
		return err
	}
	masters, err := p.checkBrokerSettings(ctx)
	if err != nil {
		return err
	}
	rmqlog.Install(p.cfg.Logger)
	tp, err := broker.NewTxProducer(broker.TxProducerConfig{
		Group: p.cfg.Group, InstanceName: p.cfg.InstanceName, NameServers: p.cfg.NameServers,
		SendTimeout: p.cfg.SendTimeout, Retries: p.cfg.SendRetries, Listener: &listener{p: p},
		// A stored probe is ended with ROLLBACK without the listener.
		ProbeProperty: checkback.PropProbe,
	})
	if err != nil {
		return fmt.Errorf("txproducer: create client: %w", err)
	}
	started := time.Now()
	if err := tp.Start(); err != nil {
		return fmt.Errorf("txproducer: start client: %w", err)
	}
	fail := func(err error) error {
		_ = tp.Shutdown()
		return err
	}
	if err := p.warmup(ctx, tp, started); err != nil {
		return fail(err)
	}
	if p.recovery != nil {
		if err := p.recovery.Start(ctx); err != nil {
			return fail(fmt.Errorf("txproducer: %w", err))
		}
	}
	p.tp = tp
	p.brokers = p.watchBrokers(tp, masters)
	p.state = stateStarted
	return nil
}

func (p *Producer) probe(ctx context.Context, tp broker.TxProducer, topic string) error {
	m := broker.NewMessage(topic, []byte("rmqtx warm-up probe"))
	m.WithProperty(checkback.PropProbe, "1")
	ctx, cancel := context.WithTimeout(ctx, p.cfg.SendTimeout*time.Duration(1+p.cfg.SendRetries))
	defer cancel()
	// The client learned the topic's brokers when err is nil, whatever the
	// status: a stored probe is always ended with ROLLBACK (the seam ends it,
	// see broker.TxProducerConfig.ProbeProperty).
	if _, err := tp.SendMessageInTransaction(ctx, m); err != nil {
		return fmt.Errorf("%w: warm-up probe on %s: %w", ErrStart, topic, err)
	}
	return nil
}

// call carries one Send's closure and outcome through the client's
// argument-less local-transaction callback.
type call struct {
	ctx   context.Context
	fn    LocalTxFunc
	row   txlog.Row
	props map[string]string // the envelope properties, stored with the row
	half  string            // UNIQ_KEY of this Send's half message, set before it is sent
	ran   bool
	// keyed: the message has a routing key, so a commit is ended by Send
	// itself (syncEnd), synchronously, to keep the key's order (endsync.go).
	keyed   bool
	syncEnd bool

	// txCtx is the context of the local transaction: early is that
	// transaction, begun while the half message is in flight. stopTx ends
	// it: LocalTxTimeout after the half is stored (runLocal arms the
	// timer), or when the Send ends without a stored half.
	txCtx  context.Context
	stopTx context.CancelCauseFunc
	early  *early
	state  State
	dup    bool
	err    error

	// halfSp is the span of the half message's send, ended when the local
	// transaction starts (or the send returns without running it).
	halfSp otelx.Span
}

// Send publishes msg if and only if fn commits. See the package doc. The
// Result's State tells committed, rolled back and unknown apart; err says
// why when it is not committed (and wraps ErrLocalTx with fn's error).
//
// With Config.TracerProvider, Send is a span (otelx.SpanSend, a child of
// ctx's span) whose context the message carries; fn runs inside the
// local-transaction span.
func (p *Producer) Send(ctx context.Context, msg Message, fn LocalTxFunc) (Result, error) {
	if p.tr == nil {
		return p.send(ctx, msg, fn)
	}
	ctx, sp := p.tr.Start(ctx, otelx.SpanSend, trace.SpanKindProducer,
		otelx.Attrs{Destination: msg.Topic, Group: p.cfg.Group, EventID: msg.EventID, EventType: msg.EventType})
	res, err := p.send(ctx, msg, fn)
	sp.SetEvent(res.EventID, msg.EventType)
	sp.SetMsgID(res.MsgID)
	if res.Duplicate {
		sp.SetReason("duplicate")
	}
	sp.End(res.State.String(), errType(err))
	return res, err
}

// send is Send without its span (see tracing.go).
func (p *Producer) send(ctx context.Context, msg Message, fn LocalTxFunc) (Result, error) {
	p.mu.Lock()
	switch p.state {
	case stateNew:
		p.mu.Unlock()
		return Result{State: StateNotSent}, ErrNotStarted
	case stateClosed:
		p.mu.Unlock()
		return Result{State: StateNotSent}, ErrClosed
	}
	p.inflight.Add(1)
	tp := p.tp
	p.mu.Unlock()
	defer p.inflight.Done()

	// Before anything is sent: a check that fences this Send's half
	// raises the row of a rolled-back id past this instant (see retake).
	startedAt := time.Now()
	id := msg.EventID
	if id == "" {
		id = wire.NewEventID()
	}
	res := Result{EventID: id, State: StateNotSent} // until the half is sent
	if fn == nil {
		return res, wrapf(ErrInvalidMessage, "nil LocalTxFunc")
	}
	env := msg.envelope(id)
	if err := validate(msg, env, p.cfg.MaxPayloadBytes); err != nil {
		return res, err
	}
	msg.Tags = msg.tag() // the wire format's default tag: the event type
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("%w: %w", ErrSend, err)
	}
	props := env.Properties(msg.Payload)
	p.tr.Inject(ctx, props) // the Send span's context; stored with the txlog row too
	rm := broker.NewMessage(msg.Topic, msg.Payload)
	rm.WithProperties(props)
	if msg.Tags != "" {
		rm.WithTag(msg.Tags)
	}
	keys := append(append([]string{}, msg.Keys...), id)
	rm.WithKeys(keys)
	rmqroute.SetKey(rm, env) // one aggregate, one queue
	keyed := env.RoutingKey() != ""

	res.State = StateRolledBack // the Send has begun: a failure from here on rolled back
	c := &call{ctx: ctx, fn: fn, props: props, state: StateRolledBack, keyed: keyed, row: txlog.Row{
		EventID: id, ProducerGroup: p.cfg.Group, Topic: msg.Topic, Tags: msg.Tags, Keys: strings.Join(keys, " "),
		EventType: msg.EventType, State: txlog.StateCommitted, PayloadHash: props[wire.PropPayloadHash],
		BusinessKey: msg.BusinessKey, ResolvedBy: txlog.ByLocalCommit,
	}}
	if !p.cfg.DisablePayloadStorage {
		c.row.Payload = msg.Payload
	}
	// A caller-supplied id is not looked up first: the local transaction
	// inserts its txlog row before anything else, and a duplicate key there
	// decides from the existing row (duplicate) and rolls this half back,
	// so the first Send of an id costs what an assigned id costs.
	// The half's UNIQ_KEY is chosen here, not by the client (which keeps a
	// preset one), so the txlog row that names it can be written while the
	// half is in flight.
	c.half = broker.NewUniqID()
	rm.WithProperty(broker.PropUniqKey, c.half)
	c.row.Properties = rowProperties(c.props, c.half)
	// LocalTxTimeout bounds the caller's transaction, not the wait for the
	// broker: the early transaction begins now, but its clock starts when
	// the half is stored (runLocal). Until then the half's send bounds it
	// (SendTimeout per attempt), and a Send that ends without a stored half
	// stops it (discard).
	c.txCtx, c.stopTx = context.WithCancelCause(ctx)
	defer c.stopTx(errSendEnded)
	c.early = p.begin(c.txCtx, c.row, startedAt)
	defer c.early.discard(c.stopTx)
	p.calls.Store(rm, c)
	defer p.calls.Delete(rm)

	_, c.halfSp = p.tr.Start(ctx, otelx.SpanHalfSend, trace.SpanKindClient, otelx.Attrs{})
	sr, err := p.sendInTransaction(ctx, tp, rm, c)
	endHalf(c.halfSp, sr, err) // ended already if the local transaction ran
	failpoint.Inject(failpoint.AfterEndTransaction)
	if err != nil {
		c.err = fmt.Errorf("%w: %s: %w", ErrSend, msg.Topic, err)
		p.count(msg.EventType, c)
		return res, c.err
	}
	res.MsgID = sr.MsgID
	res.TransactionID = sr.TransactionID
	if c.syncEnd {
		if err := p.ender.commit(msg.Topic, sr); err != nil {
			// Committed all the same: the check commits the half from the
			// txlog. Only the order behind the next event of the key is
			// not assured.
			p.cfg.Logger.WithField("event_id", id).WithError(err).
				Warn("txproducer: could not end a committed transaction; the broker's check will, and the next event of its key may be stored first")
		}
	}
	if !c.ran {
		c.err = p.notRun(msg, sr, c)
		p.count(msg.EventType, c)
		return res, c.err
	}
	res.State, res.Duplicate = c.state, c.dup
	p.count(msg.EventType, c)
	return res, c.err
}

// sendInTransaction sends rm's half, runs the local transaction once the
// broker stored it, and ends the transaction. A Send without a routing key
// leaves all three to the client's SendMessageInTransaction, which ends the
// transaction one-way. A keyed Send ends it itself (endsync.go): it sends
// the half with the seam's SendHalf, which does not end it, runs the same
// listener the client would, and then ends a ROLLBACK here and a COMMIT in
// send, each with a request the broker answers, and an UNKNOWN not at all
// (the check decides from the txlog). So the broker gets one END_TRANSACTION
// per keyed Send, not also the client's UNKNOWN one, which it ignores but
// logs at WARN per Send. On a client whose layout the seam does not know
// (broker.ErrNoHalfSend, nothing sent) the client's path is taken.
func (p *Producer) sendInTransaction(ctx context.Context, tp broker.TxProducer, rm *broker.Message, c *call) (*broker.TransactionSendResult, error) {
	if !c.keyed {
		return tp.SendMessageInTransaction(ctx, rm)
	}
	res, err := tp.SendHalf(ctx, rm)
	if errors.Is(err, broker.ErrNoHalfSend) {
		return tp.SendMessageInTransaction(ctx, rm)
	}
	if err != nil {
		return nil, err
	}
	st := broker.UnknownState
	switch res.Status {
	case broker.SendOK:
		st = (&listener{p: p}).ExecuteLocalTransaction(rm)
	case broker.SendFlushDiskTimeout, broker.SendFlushSlaveTimeout, broker.SendSlaveNotAvailable:
		// What the client answers for these statuses (see notRun).
		st = broker.RollbackMessageState
	}
	sr := &broker.TransactionSendResult{SendResult: res, State: st}
	switch st {
	case broker.CommitMessageState:
		// The listener answers UNKNOWN for a keyed commit and has send end
		// it; a COMMIT from it is ended the same way.
		c.syncEnd = true
	case broker.RollbackMessageState:
		if err := p.ender.rollback(rm.Topic, sr); err != nil {
			p.cfg.Logger.WithField("event_id", c.row.EventID).WithError(err).
				Warn("txproducer: could not end a rolled-back transaction; the broker's check will")
		}
	}
	return sr, nil
}

// notRun is the error of a Send whose half the broker stored but whose
// local transaction the client did not run (err from the client is nil).
// The client does that on a stored half answered FLUSH_SLAVE_TIMEOUT,
// SLAVE_NOT_AVAILABLE or FLUSH_DISK_TIMEOUT, and ends the half with
// ROLLBACK itself: a SYNC_MASTER whose slave is down rolls back every
// transactional send. Nothing committed (the early transaction is rolled
// back by send's deferred discard, so no txlog row exists), and the caller
// learns which status did it, the log says so without the payload, and
// count records it as forced_rollback (ErrForcedRollback).
func (p *Producer) notRun(msg Message, sr *broker.TransactionSendResult, c *call) error {
	if sr == nil || sr.SendResult == nil {
		return wrapf(ErrSend, "%s: no send result; local transaction not run", msg.Topic)
	}
	name, why, forced := forcedRollback(sr.Status)
	if !forced || sr.State != broker.RollbackMessageState {
		// Not a status the client is known to answer this way.
		return wrapf(ErrSend, "%s: broker status %d; local transaction not run", msg.Topic, sr.Status)
	}
	l := p.cfg.Logger.WithFields(logrus.Fields{"event_id": c.row.EventID, "topic": msg.Topic, "half": c.half, "broker_status": name})
	if sr.MessageQueue != nil {
		l = l.WithField("broker", sr.MessageQueue.BrokerName)
	}
	l.Warn("txproducer: the broker stored the half but reported " + name + " (" + why + "); the client ended it with ROLLBACK " +
		"and the local transaction did not run: nothing committed, retry with the same event id once the broker recovers")
	return wrapf(ErrForcedRollback, "%s: the broker stored the half but reported %s: %s; the client ended the half with ROLLBACK "+
		"and your function did not run; nothing committed", msg.Topic, name, why)
}

// count records a Send's outcome: committed, duplicate (committed by an
// earlier or concurrent Send), rolled_back (the caller's function),
// forced_rollback (the client rolled a stored half back on the broker's
// status, ErrForcedRollback), unknown, or error.
func (p *Producer) count(eventType string, c *call) {
	m := p.cfg.Metrics
	if m == nil {
		return
	}
	result := "error"
	switch {
	case c.dup:
		result = "duplicate"
	case c.state == StateCommitted:
		result = "committed"
	case c.state == StateUnknown:
		result = "unknown"
	case errors.Is(c.err, ErrLocalTx):
		result = "rolled_back"
	case errors.Is(c.err, ErrForcedRollback):
		result = "forced_rollback"
	}
	m.ProducerSends.WithLabelValues(p.cfg.Group, eventType, result).Inc()
}

// existing sets c's outcome from the row another Send left for its event
// id. A committed event with the same payload is this Send's success too
// (Duplicate): the half that committed it delivers it, so this Send must
// not publish a second copy.
func (p *Producer) existing(c *call, row txlog.Row) {
	switch {
	case row.State == txlog.StateRolledBack && row.Half() == "":
		// Written before rmqtx named halves: final for every half, so no
		// Send can take it over (txlog.Retakable).
		c.state, c.err = StateRolledBack, fmt.Errorf("%w: %s (resolved by %s; %w)", ErrFenced, row.EventID, row.ResolvedBy, errFinalRollback)
	case row.State == txlog.StateRolledBack:
		c.state, c.err = StateRolledBack, wrapf(ErrFenced, "%s (resolved by %s)", row.EventID, row.ResolvedBy)
	case row.PayloadHash != c.row.PayloadHash:
		c.state, c.err = StateRolledBack, wrapf(ErrEventIDConflict, "%s", row.EventID)
		p.cfg.Logger.WithField("event_id", row.EventID).Warn("txproducer: event id reused with a different payload")
	default:
		c.state, c.dup, c.err = StateCommitted, true, nil
	}
}

// runLocal finishes the local transaction once the half is stored: it takes
// the early transaction (BEGIN; INSERT txlog row, begun while the half was
// in flight), runs fn and COMMITs. It returns the answer for the broker,
// which is always backed by the txlog (COMMIT: our row committed; ROLLBACK:
// a ROLLED_BACK row is persisted, or the row is another half's; otherwise
// UNKNOWN and the check decides).
func (p *Producer) runLocal(c *call, half string) broker.LocalTransactionState {
	if h := p.cfg.Test.HalfStored; h != nil {
		h(c.row.EventID)
	}
	// The half is stored: from now on the local transaction has
	// LocalTxTimeout, however long the broker took (see send).
	deadline := time.Now().Add(p.cfg.LocalTxTimeout)
	expire := time.AfterFunc(p.cfg.LocalTxTimeout, func() { c.stopTx(errLocalTxTimeout) })
	defer expire.Stop()
	failpoint.Inject(failpoint.AfterHalfMessage)
	c.ran = true
	l := p.cfg.Logger.WithField("event_id", c.row.EventID)
	if half != c.half {
		// The client keeps a preset UNIQ_KEY, so this cannot happen; if it
		// did, the row would name another half as the winner. The early
		// row goes first: the fence below would wait on its lock.
		c.early.discard(c.stopTx)
		c.err = wrapf(ErrSend, "half message id changed in flight")
		return p.rollback(c, l)
	}
	tx, err := c.early.take()
	if err != nil {
		if errors.Is(err, txlog.ErrDuplicate) {
			return p.duplicate(c)
		}
		c.err = err
		return p.rollback(c, l)
	}
	failpoint.Inject(failpoint.InsideLocalTx)
	// fn gets c.ctx (which carries the local-transaction span when tracing
	// is on), with the transaction's deadline. It ends when the
	// transaction's context does, never before: a function that waits for
	// it and returns nil then meets a transaction that is already ended,
	// and its COMMIT fails (two timers for one deadline could fire in
	// either order, and the COMMIT then succeed past LocalTxTimeout).
	ctx, cancel := txContext(c.ctx, c.txCtx, deadline)
	defer cancel()
	if err := callFn(ctx, c.fn, tx); err != nil {
		_ = tx.Rollback()
		c.err = fmt.Errorf("%w: %w", ErrLocalTx, txEnded(ctx, c, err))
		return p.rollback(c, l)
	}
	if err := tx.Commit(); err != nil {
		return p.commitFailed(c, l, txEnded(ctx, c, err))
	}
	failpoint.Inject(failpoint.AfterLocalCommit)
	c.state = StateCommitted
	return broker.CommitMessageState
}

// txContext is the context fn runs with: parent's values, tx's end (and
// its cause), and deadline as its Deadline, which tx's timer enforces.
func txContext(parent, tx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	stop := context.AfterFunc(tx, func() { cancel(context.Cause(tx)) })
	return deadlineCtx{ctx, deadline}, func() { stop(); cancel(nil) }
}

// deadlineCtx reports a deadline that another context enforces.
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

func (c deadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// Err is context.DeadlineExceeded when the deadline ended it, as for a
// context.WithDeadline.
func (c deadlineCtx) Err() error {
	err := c.Context.Err()
	if err != nil && errors.Is(context.Cause(c.Context), context.DeadlineExceeded) {
		return context.DeadlineExceeded
	}
	return err
}

// early is a Send's local transaction, begun while its half message is in
// flight: BEGIN and the txlog INSERT overlap the half's round trip to the
// broker instead of following it, so after the half is stored only the
// caller's statements and the COMMIT remain. Nothing is visible before the
// COMMIT, which still follows the half (I1): if the half fails, the
// transaction is rolled back and no row ever existed. The row is inserted
// first in the transaction, as before, so a check's fence and a second
// Send of the id wait on its lock (I3).
type early struct {
	done chan struct{}
	tx   *sqlx.Tx
	err  error // wraps ErrDatabase, or is txlog.ErrDuplicate
}

// overlapWorkers bounds the long-lived goroutines that run early
// transactions: Sends beyond that many at once start a goroutine each, as
// every Send did before. An idle worker holds its grown stack (a few KB to
// tens of KB) until Shutdown.
const overlapWorkers = 128

// begin starts the early transaction for row. ctx bounds the transaction:
// it has no deadline of its own while the half is in flight (see send).
// startedAt is when the Send began, before its half was sent (see retake).
//
// It runs on one of the producer's long-lived workers (internal/workerpool)
// rather than a new goroutine: BEGIN and the INSERT through database/sql and
// the driver grew a new goroutine's stack two or three times per Send, 10-13
// µs of CPU (BENCHMARKS.md).
func (p *Producer) begin(ctx context.Context, row txlog.Row, startedAt time.Time) *early {
	e := &early{done: make(chan struct{})}
	p.overlap.Go(func() {
		defer close(e.done)
		if h := p.cfg.Test.BeforeLocalTx; h != nil {
			h(ctx, row.EventID)
		}
		if err := ctx.Err(); err != nil {
			e.err = fmt.Errorf("%w: %w", ErrDatabase, err)
			return
		}
		tx, err := p.db.BeginTxx(ctx, nil)
		if err != nil {
			e.err = fmt.Errorf("%w: begin: %w", ErrDatabase, err)
			return
		}
		row.CreatedAt, row.ResolvedAt = time.Time{}, time.Time{}
		err = p.log.Insert(ctx, tx, row)
		if errors.Is(err, txlog.ErrDuplicate) {
			// The id has a row. If it records a rollback for another half,
			// this Send may commit the id after all (a retry of a failed
			// Send with the same id): retake it in a transaction of its own,
			// PostgreSQL's having been aborted by the duplicate key.
			_ = tx.Rollback()
			tx, err = p.retake(ctx, row, startedAt)
		}
		if err != nil {
			if tx != nil {
				_ = tx.Rollback()
			}
			e.err = err
			if !errors.Is(err, txlog.ErrDuplicate) {
				e.err = fmt.Errorf("%w: %w", ErrDatabase, err)
			}
			return
		}
		e.tx = tx
	})
	return e
}

// retake begins the transaction that takes over an event id whose txlog
// row records a rollback for another half (txlog.Store.Retake): the row
// then names this Send's half, and every other half of the id is answered
// ROLLBACK. It returns the transaction holding the row, or an error
// wrapping txlog.ErrDuplicate when the row is committed or final for this
// half (the caller decides from the row, see existing).
func (p *Producer) retake(ctx context.Context, row txlog.Row, startedAt time.Time) (*sqlx.Tx, error) {
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	took, err := p.log.Retake(ctx, tx, row, startedAt)
	switch {
	case err != nil:
		_ = tx.Rollback()
		return nil, err
	case !took:
		_ = tx.Rollback()
		return nil, fmt.Errorf("%w: %s", txlog.ErrDuplicate, row.EventID)
	}
	return tx, nil
}

// take waits for the early transaction and hands it over: the caller
// commits or rolls it back.
func (e *early) take() (*sqlx.Tx, error) {
	<-e.done
	tx := e.tx
	e.tx = nil
	return tx, e.err
}

// discard rolls the early transaction back unless take handed it over
// (the half failed, or the client never ran the local transaction). A BEGIN
// or INSERT still running is stopped with stop: nothing of it is kept, and
// with no stored half nothing else bounds it.
func (e *early) discard(stop context.CancelCauseFunc) {
	select {
	case <-e.done:
	default:
		stop(errSendEnded)
		<-e.done
	}
	if e.tx != nil {
		_ = e.tx.Rollback()
		e.tx = nil
	}
}

// rowProperties is the JSON of the envelope properties plus the half's
// UNIQ_KEY, which tells the checks which half committed (checkback.OtherHalf).
// propjson writes what json.Marshal writes for the merged map, without
// copying the map or reflecting on it: it runs on every Send.
func rowProperties(props map[string]string, half string) string {
	if half == "" {
		return propjson.Encode(props, "", "")
	}
	return propjson.Encode(props, broker.PropUniqKey, half)
}

func callFn(ctx context.Context, fn LocalTxFunc, tx *sqlx.Tx) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx, tx)
}

// shortCtx is for the producer's own bookkeeping statements: independent of
// the caller's (possibly cancelled) context, bounded by CheckTimeout.
func (p *Producer) shortCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), p.cfg.CheckTimeout)
}

// rollback persists the local rollback so the answer is final (I3). If that
// cannot be written the answer is UNKNOWN and a check decides.
func (p *Producer) rollback(c *call, l logrus.FieldLogger) broker.LocalTransactionState {
	c.state = StateRolledBack
	ctx, cancel := p.shortCtx()
	defer cancel()
	r := c.row
	r.Payload, r.ResolvedBy = nil, txlog.ByLocalRollback
	row, _, err := p.log.Fence(ctx, r)
	if err != nil {
		l.WithError(err).Warn("txproducer: could not persist the rollback; answering UNKNOWN, a check will fence")
		return broker.UnknownState
	}
	if row.State == txlog.StateCommitted && row.PayloadHash == c.row.PayloadHash && !errors.Is(c.err, ErrLocalTx) {
		// Another Send with this id committed the same event meanwhile: the
		// event is committed, and that Send's half delivers it.
		c.state, c.dup, c.err = StateCommitted, true, nil
	}
	return broker.RollbackMessageState
}

// duplicate handles an event id that already has a row: another half
// decided it, so this half is rolled back whatever the row says (a
// committed event is delivered by the half that committed it).
func (p *Producer) duplicate(c *call) broker.LocalTransactionState {
	ctx, cancel := p.shortCtx()
	defer cancel()
	row, err := p.log.Get(ctx, c.row.EventID)
	if err != nil {
		// The row exists, so this half is not the one that committed it: a
		// check answers ROLLBACK for it (checkback.OtherHalf). The caller learns the
		// outcome by sending the same id again.
		c.state, c.err = StateUnknown, fmt.Errorf("%w: event id exists, its row could not be read: %w", ErrCommitUnknown, err)
		return broker.RollbackMessageState
	}
	p.existing(c, row)
	return broker.RollbackMessageState
}

// commitFailed learns the outcome of a COMMIT that returned an error by
// fencing: the INSERT IGNORE waits if the commit is still being applied,
// and the row then says what happened.
func (p *Producer) commitFailed(c *call, l logrus.FieldLogger, cerr error) broker.LocalTransactionState {
	ctx, cancel := p.shortCtx()
	defer cancel()
	r := c.row
	r.Payload, r.ResolvedBy = nil, txlog.ByLocalRollback
	row, _, err := p.log.Fence(ctx, r)
	if err != nil {
		c.state, c.err = StateUnknown, fmt.Errorf("%w: %w (reading the outcome: %w)", ErrCommitUnknown, cerr, err)
		l.WithError(c.err).Error("txproducer: commit outcome unknown; the txlog decides")
		return broker.UnknownState
	}
	if row.State == txlog.StateCommitted {
		if checkback.OtherHalf(row, c.half) {
			// Our commit failed and another Send committed the id.
			p.existing(c, row)
			return broker.RollbackMessageState
		}
		c.state = StateCommitted
		return broker.CommitMessageState
	}
	c.state, c.err = StateRolledBack, fmt.Errorf("%w: commit: %w", ErrDatabase, cerr)
	return broker.RollbackMessageState
}

// Shutdown stops accepting Sends, waits for the ones in flight (bounded by
// ctx), stops recovery and the client, and stops the client's check
// goroutine. It is idempotent.
func (p *Producer) Shutdown(ctx context.Context) error {
	p.mu.Lock()
	if p.state == stateClosed {
		p.mu.Unlock()
		return nil
	}
	wasStarted := p.state == stateStarted
	p.state = stateClosed
	tp := p.tp
	p.mu.Unlock()
	if !wasStarted {
		return nil
	}
	// The watcher heartbeats through the client: it stops before the client.
	p.brokers.stop()
	done := make(chan struct{})
	go func() { p.inflight.Wait(); close(done) }()
	var errs []error
	drained := true
	select {
	case <-done:
	case <-ctx.Done():
		drained = false
		errs = append(errs, fmt.Errorf("waiting for sends in flight: %w (the client stops when they return)", ctx.Err()))
	}
	if p.recovery != nil {
		if err := p.recovery.Shutdown(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	stop := func() error {
		p.ender.close()
		// Every Send has returned, so every early transaction has ended
		// (discard or take waits for it): the workers are idle and end now.
		_ = p.overlap.Shutdown(context.Background())
		return tp.Shutdown()
	}
	if drained {
		if err := stop(); err != nil {
			errs = append(errs, err)
		}
	} else {
		// Stopping the client under a running SendMessageInTransaction
		// races inside the client (its end-transaction reads state that
		// Shutdown writes). The sends are bounded by SendTimeout and
		// LocalTxTimeout, so stop it as soon as they return.
		go func() {
			<-done
			if err := stop(); err != nil {
				p.cfg.Logger.Warnf("txproducer: deferred client shutdown: %v", err)
			}
		}()
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("txproducer: shutdown: %w", err)
	}
	return nil
}

// Close is Shutdown bounded by shutdown.DefaultCloseTimeout (30 s), the
// bound every rmqtx Close shares: sends still running then are left to
// finish and the client stops when they return.
func (p *Producer) Close() error { return shutdown.Close(p.Shutdown) }

// listener adapts the client's argument-less callbacks. Both methods
// recover panics: on this client a panic would end the check loop for good.
type listener struct{ p *Producer }

func (l *listener) ExecuteLocalTransaction(m *broker.Message) (st broker.LocalTransactionState) {
	defer func() {
		if v := recover(); v != nil {
			l.p.cfg.Logger.Errorf("txproducer: panic in the local transaction callback: %v", rmqlog.ScrubValue(v))
			st = broker.UnknownState
		}
	}()
	v, ok := l.p.calls.Load(m)
	if !ok {
		// Not a Send of ours (probes never get here, see broker.TxProducerConfig.ProbeProperty).
		return broker.RollbackMessageState
	}
	c := v.(*call)
	st = l.p.runLocalTraced(c, m.GetProperty(broker.PropUniqKey))
	if lose := l.p.cfg.Test.LoseEnd; lose != nil && lose(c.row.EventID) {
		return broker.UnknownState
	}
	if st == broker.CommitMessageState && c.keyed {
		// Send ends it itself once the client returns (see endsync.go).
		c.syncEnd = true
		return broker.UnknownState
	}
	return st
}

func (l *listener) CheckLocalTransaction(m *broker.MessageExt) (st broker.LocalTransactionState) {
	defer func() {
		if v := recover(); v != nil {
			l.p.cfg.Logger.Errorf("txproducer: panic in the check callback: %v", rmqlog.ScrubValue(v))
			st = broker.UnknownState
		}
	}()
	return l.p.checker.Check(context.Background(), m).Decision.LocalTransactionState()
}
