package broker

import (
	"context"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/producer"
)

// QueueSelector picks the queue of a send among a topic's write queues
// (lastBroker is the broker of a failed earlier attempt, or ""). It is the
// client's own interface; rmqroute.Selector is the one rmqtx senders use.
type QueueSelector = producer.QueueSelector

// The client's sentinel errors a sender classifies.
var (
	// ErrRequestTimeout: the broker did not answer within the send
	// timeout; the message may be stored.
	ErrRequestTimeout = rmqerrors.ErrRequestTimeout
	// ErrNotRunning: the producer is not started (or shut down).
	ErrNotRunning = rmqerrors.ErrNotRunning
)

// ProducerConfig is what NewProducer builds a plain (non-transactional)
// producer from.
type ProducerConfig struct {
	NameServers  []string
	Group        string
	InstanceName string
	// SendTimeout bounds one send attempt; zero or less: the client's
	// default (3 s).
	SendTimeout time.Duration
	// Retries is how often the client itself retries a failed send before
	// returning (it is always passed on: 0 means none).
	Retries int
	// Selector picks a message's queue; nil: the client's default.
	Selector QueueSelector
}

// Producer is the plain producer owners see: SendSync of one message, or
// of several as one batch (the broker stores a batch whole or not at all),
// and SendBatch, the batch with the workaround below. Read the result with
// CheckSendResult.
type Producer interface {
	Start() error
	Shutdown() error
	SendSync(ctx context.Context, msgs ...*Message) (*SendResult, error)
	// SendBatch sends msgs as one batch with SendSync, first giving each
	// message without a UNIQ_KEY one of its own.
	SendBatch(ctx context.Context, msgs []*Message) (*SendResult, error)
}

// NewProducer builds a plain producer that is not started.
func NewProducer(cfg ProducerConfig) (Producer, error) {
	opts := []producer.Option{
		producer.WithNsResolver(NameServers(cfg.NameServers)),
		producer.WithGroupName(cfg.Group),
		producer.WithInstanceName(cfg.InstanceName),
	}
	if cfg.SendTimeout > 0 {
		opts = append(opts, producer.WithSendMsgTimeout(cfg.SendTimeout))
	}
	opts = append(opts, producer.WithRetry(cfg.Retries))
	if cfg.Selector != nil {
		opts = append(opts, producer.WithQueueSelector(cfg.Selector))
	}
	p, err := rocketmq.NewProducer(opts...)
	if err != nil {
		return nil, err
	}
	return plainProducer{Producer: p}, nil
}

// plainProducer is the client's Producer with SendBatch and the route
// race waited out (routerace.go).
type plainProducer struct {
	rocketmq.Producer
	// settle waits for a route update in progress; nil: settleRoute on
	// the client behind Producer (tests replace it).
	settle func(topic string) bool
}

// SendSync sends msgs; a send that met the client's route race (a
// concurrent first send to the topic was recording its route: "route info
// not found") waits for that update to finish and is sent once more
// (routerace.go). Client patch 9 removes the race in rmqtx's own build;
// this is for services built with the upstream client.
func (p plainProducer) SendSync(ctx context.Context, msgs ...*Message) (*SendResult, error) {
	settle := p.settle
	if settle == nil {
		settle = func(topic string) bool { return settleRoute(p.Producer, topic) }
	}
	topic := ""
	if len(msgs) > 0 {
		topic = msgs[0].Topic
	}
	return sendSettled(ctx, settle, topic, func() (*SendResult, error) { return p.Producer.SendSync(ctx, msgs...) })
}

// SendBatch works around the client's batch encoding: it gives the
// messages of a batch no UNIQ_KEY (client message id) of their own, where a
// single send would carry one (no upstream issue found: the client's
// defaultProducer sets the key only when what it sends is not a batch).
// Consumers identify a message by it, so each message gets one here, as a
// single send would give it.
func (p plainProducer) SendBatch(ctx context.Context, msgs []*Message) (*SendResult, error) {
	for _, m := range msgs {
		if m.GetProperty(PropUniqKey) == "" {
			m.WithProperty(PropUniqKey, NewUniqID())
		}
	}
	return p.SendSync(ctx, msgs...)
}
