package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/rmqname"
	"github.com/rmqtx/rmqtx/internal/shutdown"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/rmqmsg"
	"github.com/rmqtx/rmqtx/wire"
)

// RocketMQConfig configures a RocketMQSink.
type RocketMQConfig struct {
	// NameServers lists the name servers ("127.0.0.1:9876"). Required: the
	// client's default resolver (an HTTP endpoint) is never used.
	NameServers []string
	// Group is the producer group. Default "rmqtx_outbox". Keep it distinct
	// from transactional producer groups (rocketmq-client-go #998).
	Group string
	// InstanceName names the client. Default: "rmqtx-outbox-" plus a random
	// suffix, so every sink has its own client (the Go client shares clients
	// by instance name within a process).
	InstanceName string
	// SendTimeout bounds one send request. Default 3s. A send that times out
	// is an unknown result and is retried by the dispatcher.
	SendTimeout time.Duration
	// Retries is how often the client itself retries a failed send before
	// returning. Default 0: the dispatcher retries with backoff instead, and
	// a permanent error is not repeated.
	Retries int
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), as in every rmqtx Config, so one Observe value can be handed
	// to every component. The sink uses its Logger only: the client's log
	// lines (routed once per process, see package observe). The sends are
	// counted and traced by the Dispatcher (Config.Observe); Metrics and
	// TracerProvider are not used here.
	observe.Observe
	// MaxBatchBytes bounds one batch send (see RocketMQSink.Batches): the
	// dispatcher sends a claim's rows as one RocketMQ batch per target
	// queue. Default DefaultMaxBatchBytes (1 MiB); negative: every row is
	// sent alone.
	MaxBatchBytes int
}

// RocketMQSink sends outbox rows as normal RocketMQ messages with SendSync.
//
// Each message is in the public wire format (package wire, WIRE.md): the
// envelope properties, the keys [message key, event id] (the id last), the
// event type as tag, and a sharding key (the aggregate, else the message key)
// from which the queue is chosen by wire.QueueFor, as txproducer.Send
// chooses it: every event of one aggregate lands on one queue, so a consumer
// that keeps the queue's order (the rmqtx consumer does, per key) sees them
// in the order they were sent.
//
// Error classes: no permission and message illegal (codes 16, 13), an
// invalid topic name and an empty payload (which Enqueue accepts for a
// FuncSink) are permanent; a topic missing at the broker (code 17) is the
// cluster's setup, retried with backoff (internal/broker/brokerclass); a
// timeout, a lost connection or a non-OK store status (flush or slave
// timeout) is unknown; everything else, including "no route to topic", is
// transient. The client cannot tell "the name server and brokers are down"
// from "the topic is missing and auto-create is off": both surface as no
// route, so no route is retried (bounded by MaxRetries), never DEAD at once.
type RocketMQSink struct {
	p             broker.Producer
	queues        *queueBook // the client's queue selector, which batches are grouped by
	maxBatchBytes int        // <= 0: no batches
	closeOnce     sync.Once
	nameServers   []string // checked by Dispatcher.Start (startcheck.go)
}

// NewRocketMQSink creates and starts a producer. Close it after the
// dispatchers using it are shut down.
func NewRocketMQSink(cfg RocketMQConfig) (*RocketMQSink, error) {
	if err := rmqname.NameServers(cfg.NameServers); err != nil {
		return nil, fmt.Errorf("%w: NameServers %w", ErrConfig, err)
	}
	if cfg.Group == "" {
		cfg.Group = "rmqtx_outbox"
	}
	if cfg.InstanceName == "" {
		cfg.InstanceName = "rmqtx-outbox-" + randomSuffix()
	}
	if cfg.SendTimeout <= 0 {
		cfg.SendTimeout = 3 * time.Second
	}
	if cfg.Retries < 0 {
		cfg.Retries = 0
	}
	if cfg.MaxBatchBytes == 0 {
		cfg.MaxBatchBytes = DefaultMaxBatchBytes
	}
	book := newQueueBook()
	rmqlog.Install(cfg.Logger)
	p, err := broker.NewProducer(broker.ProducerConfig{
		NameServers:  cfg.NameServers,
		Group:        cfg.Group,
		InstanceName: cfg.InstanceName,
		SendTimeout:  cfg.SendTimeout,
		Retries:      cfg.Retries,
		Selector:     book,
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: rocketmq producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("outbox: start rocketmq producer: %w", err)
	}
	return &RocketMQSink{p: p, queues: book, maxBatchBytes: cfg.MaxBatchBytes, nameServers: cfg.NameServers}, nil
}

// ShardingKey is the key the RocketMQ sink routes e by:
// wire.RoutingKey of its aggregate ("type/id"), else its message key (the
// business key), else "" (any queue). txproducer.Send routes by the same
// key and hash (WIRE.md, "Queue routing"), so one aggregate's events share
// a queue whichever of the two sent them.
func ShardingKey(e Event) string {
	return wire.RoutingKey(e.AggregateType, e.AggregateID, e.MessageKey)
}

// RocketMQMessage builds the RocketMQ message for m (exported for tools that
// re-publish rows by hand, such as a replay).
func RocketMQMessage(m *Message) *rmqmsg.Message {
	msg := broker.NewMessage(m.Destination, m.Payload)
	msg.WithProperties(m.Envelope().Properties(m.Payload))
	var keys []string
	if m.MessageKey != "" {
		keys = []string{m.MessageKey}
	}
	msg.WithKeys(wire.Keys(keys, m.EventID))
	msg.WithTag(m.EventType)
	if k := ShardingKey(m.Event); k != "" {
		msg.WithShardingKey(k)
	}
	otelx.InjectSpanContext(m.trace, msg)
	return msg
}

// Send sends m with SendSync and classifies the outcome.
func (s *RocketMQSink) Send(ctx context.Context, m *Message) error {
	if err := s.validate(m); err != nil {
		return err
	}
	res, err := s.p.SendSync(ctx, RocketMQMessage(m))
	if err != nil {
		return classifyRocketMQ(ctx, err)
	}
	return sendStatus(res)
}

// validate refuses, permanently, what the broker would refuse.
func (s *RocketMQSink) validate(m *Message) error {
	if !rmqname.ValidTopic(m.Destination) {
		return NewSendError(ClassPermanent, "invalid_destination",
			fmt.Errorf("%w: %q is not a valid RocketMQ topic name", ErrInvalidDestination, m.Destination))
	}
	if err := m.Envelope().Validate(); err != nil {
		return NewSendError(ClassPermanent, "invalid_envelope", fmt.Errorf("%w: %w", ErrMessageIllegal, err))
	}
	// Enqueue accepts an empty payload (a FuncSink command may need none),
	// but a broker refuses an empty body, and with a code (1, an internal
	// error) that reads as transient: the row would retry for MaxRetries
	// before going DEAD. txproducer.Send refuses one up front too.
	if len(m.Payload) == 0 {
		return NewSendError(ClassPermanent, "empty_payload",
			fmt.Errorf("%w: the payload is empty, and RocketMQ brokers refuse a message without a body (enqueue at least one byte, e.g. {})", ErrMessageIllegal))
	}
	return nil
}

// sendStatus classifies a send result that came with no error, by the
// reading every rmqtx sender shares (broker.CheckSendResult, on the
// broker-answer table of internal/broker/brokerclass).
func sendStatus(res *broker.SendResult) error {
	err := broker.CheckSendResult(res)
	var se *broker.StatusError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &se):
		return NewSendError(se.Answer.Class, se.Answer.Name, fmt.Errorf("outbox: rocketmq: %w", se))
	default:
		return NewSendError(ClassUnknown, "no_result", errors.New("outbox: rocketmq returned no send result"))
	}
}

// Shutdown shuts the producer down, waiting for the client at most until ctx
// ends (the client then finishes in the background). Idempotent: a second
// call returns nil at once.
func (s *RocketMQSink) Shutdown(ctx context.Context) error {
	first := false
	s.closeOnce.Do(func() { first = true })
	if !first {
		return nil
	}
	if err := shutdown.Wait(ctx, s.p.Shutdown); err != nil {
		return fmt.Errorf("outbox: rocketmq shutdown: %w", err)
	}
	return nil
}

// Close is Shutdown bounded by shutdown.DefaultCloseTimeout (30 s), the
// bound every rmqtx Close shares.
func (s *RocketMQSink) Close() error { return shutdown.Close(s.Shutdown) }

// classifyRocketMQ maps the Go client's errors, which carry no types beyond a
// few sentinels, to SendErrors. The client formats broker refusals as
// "CODE: <n>  DESC: <remark>".
func classifyRocketMQ(ctx context.Context, err error) error {
	wrap := func(class Class, code string, sentinel error) error {
		if sentinel != nil {
			return NewSendError(class, code, fmt.Errorf("%w: rocketmq: %w", sentinel, err))
		}
		return NewSendError(class, code, fmt.Errorf("outbox: rocketmq: %w", err))
	}
	msg := err.Error()
	if a, ok := brokerclass.OfError(err); ok {
		// One table decides every broker answer (internal/broker/brokerclass): a
		// missing topic or a refused permission is the cluster's setup, an
		// operator's fix, so the row is retried with backoff (and the
		// dispatcher logs the fix), not DEAD at once.
		switch a.Code {
		case brokerclass.TopicNotExist:
			return wrap(a.Class, a.Name, ErrTopicNotExist)
		case brokerclass.NoPermission:
			return wrap(a.Class, a.Name, ErrNoPermission)
		case brokerclass.MessageIllegal:
			return wrap(a.Class, a.Name, ErrMessageIllegal)
		}
		return wrap(a.Class, a.Name, nil)
	}
	var nerr net.Error
	switch {
	case errors.Is(err, broker.ErrRequestTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &nerr) && nerr.Timeout():
		return wrap(ClassUnknown, "timeout", ErrSendTimeout)
	case ctx.Err() != nil || errors.Is(err, context.Canceled):
		return wrap(ClassUnknown, "canceled", nil)
	case strings.Contains(msg, "route info not found"):
		return wrap(ClassTransient, "no_route", ErrNoRoute)
	case errors.Is(err, syscall.ECONNREFUSED):
		// nothing received the request
		return wrap(ClassTransient, "connection_refused", nil)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed):
		// the request may have reached the broker
		return wrap(ClassUnknown, "connection_lost", nil)
	case errors.Is(err, broker.ErrNotRunning):
		return wrap(ClassTransient, "not_running", nil)
	default:
		return wrap(ClassTransient, "", nil)
	}
}
