package broker

import (
	"context"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"

	"github.com/rmqtx/rmqtx/internal/broker/rmqroute"
)

// TxListener is the transactional producer's two callbacks: the local
// transaction of a half just stored, and the broker's check of a pending
// half. It is the client's own interface, so any implementation of one is
// one of the other.
type TxListener = primitive.TransactionListener

// NsResolver is how a client finds the name servers.
type NsResolver = primitive.NsResolver

// MessageID is a broker message id (offset message id) decoded.
type MessageID = primitive.MessageID

// NameServers returns the resolver that uses exactly addrs. The client's
// default (an HTTP lookup off this machine) is never used by rmqtx.
func NameServers(addrs []string) NsResolver { return primitive.NewPassthroughResolver(addrs) }

// UnmarshalMsgID decodes a broker's offset message id (the store host and
// the commit-log offset of the message).
func UnmarshalMsgID(id []byte) (*MessageID, error) { return primitive.UnmarshalMsgID(id) }

// DecodeMessages decodes a broker's message-list body (the answer to
// QUERY_MESSAGE, PULL_MESSAGE and the like).
func DecodeMessages(body []byte) []*MessageExt { return primitive.DecodeMessage(body) }

// TxProducerConfig is what NewTxProducer builds a transactional producer
// from.
type TxProducerConfig struct {
	Group        string
	InstanceName string
	NameServers  []string
	SendTimeout  time.Duration // per attempt
	Retries      int           // attempts after the first
	Listener     TxListener

	// ProbeProperty names the property that marks a warm-up probe: a
	// message carrying it with a non-empty value is ended with ROLLBACK
	// without calling Listener (see probeRollback). Empty: no probes.
	ProbeProperty string
}

// TxProducer is the transactional producer owners see: the client's
// lifecycle and send, plus the two calls the client offers no API for.
// Keyed messages (rmqroute.SetKey) go to wire.QueueFor's queue.
type TxProducer interface {
	Start() error
	Shutdown() error
	// SendMessageInTransaction sends m as a half message, runs the
	// listener's local transaction once it is stored, and ends it with
	// the answer (one-way).
	SendMessageInTransaction(ctx context.Context, m *Message) (*TransactionSendResult, error)
	// SendHalf sends m as a half message of this producer's group, as
	// SendMessageInTransaction does, and returns the broker's answer
	// without running the listener or ending the transaction: the caller
	// ends it (halfsend.go). ErrNoHalfSend: the client's layout differs
	// and nothing was sent.
	SendHalf(ctx context.Context, m *Message) (*SendResult, error)
	// CanHeartbeat reports whether Heartbeat and RefreshRoutes can reach
	// the client (false on a client whose layout the seam does not know).
	CanHeartbeat() bool
	// Heartbeat makes the client heartbeat every broker in its route table
	// now, and returns once they answered. It reports false, having done
	// nothing, when the client's layout differs.
	Heartbeat() bool
	// RefreshRoutes makes the client read the routes of its topics from
	// the name server now (it does every 30 s). It reports false, having
	// done nothing, when the client's layout differs.
	RefreshRoutes() bool
	// HeartbeatBroker registers this producer's group with the broker at
	// addr over the client's own connection to it, whatever the broker's
	// role and whether or not the client's route table holds it: the
	// broker then sends its checks over that connection, where the client
	// answers them. Heartbeat cannot do this: the client heartbeats only
	// the masters of its route table. ErrNoHeartbeat: the client's layout
	// differs and nothing was sent.
	HeartbeatBroker(ctx context.Context, addr string) error
}

// NewTxProducer builds a transactional producer that is not started.
func NewTxProducer(cfg TxProducerConfig) (TxProducer, error) {
	opts := []producer.Option{
		producer.WithGroupName(cfg.Group),
		producer.WithInstanceName(cfg.InstanceName),
		producer.WithNsResolver(NameServers(cfg.NameServers)),
		producer.WithSendMsgTimeout(cfg.SendTimeout),
		producer.WithRetry(cfg.Retries),
	}
	if cfg.ProbeProperty != "" {
		opts = append(opts, producer.WithInterceptor(probeRollback(cfg.ProbeProperty)))
	}
	// Keyed events go to wire.QueueFor's queue (WIRE.md, "Queue routing"),
	// as the outbox's do; probes have no key.
	opts = append(opts, producer.WithQueueSelector(rmqroute.New()))
	tp, err := rocketmq.NewTransactionProducer(cfg.Listener, opts...)
	if err != nil {
		return nil, err
	}
	t := txProducer{TransactionProducer: tp, group: cfg.Group}
	t.half, _ = halfSender(tp)
	return t, nil
}

// txProducer is the client's TransactionProducer with the calls it lacks.
type txProducer struct {
	rocketmq.TransactionProducer
	group string
	half  syncSender // the client's inner producer (halfsend.go); nil: layout differs
}

// SendMessageInTransaction sends m's half; a send that met the client's
// route race waits for the route update in progress and is sent once more
// (routerace.go). The local transaction runs only after a half is stored,
// so it runs once.
func (t txProducer) SendMessageInTransaction(ctx context.Context, m *Message) (*TransactionSendResult, error) {
	settle := func(topic string) bool { return settleRoute(t.TransactionProducer, topic) }
	return sendSettled(ctx, settle, m.Topic, func() (*TransactionSendResult, error) {
		return t.TransactionProducer.SendMessageInTransaction(ctx, m)
	})
}

// SendHalf: see TxProducer and halfsend.go. The route race is waited out
// as for SendMessageInTransaction.
func (t txProducer) SendHalf(ctx context.Context, m *Message) (*SendResult, error) {
	if t.half == nil {
		return nil, ErrNoHalfSend
	}
	m.WithProperty(PropTransactionPrepared, "true")
	m.WithProperty(PropProducerGroup, t.group)
	settle := func(topic string) bool { return settleRoute(t.TransactionProducer, topic) }
	return sendSettled(ctx, settle, m.Topic, func() (*SendResult, error) { return t.half.SendSync(ctx, m) })
}

func (t txProducer) CanHeartbeat() bool  { return internalClient(t.TransactionProducer) != nil }
func (t txProducer) Heartbeat() bool     { return heartbeatNow(t.TransactionProducer) }
func (t txProducer) RefreshRoutes() bool { return refreshRoutes(t.TransactionProducer) }
func (t txProducer) HeartbeatBroker(ctx context.Context, addr string) error {
	return heartbeatBroker(ctx, t.TransactionProducer, t.group, addr)
}

// probeRollback returns a send interceptor that makes the client end a
// stored warm-up probe (a message with property prop) with ROLLBACK
// without calling the listener.
//
// Upstream workaround (no upstream issue found): for any local-transaction
// answer but COMMIT, the client's transactionProducer logs an ERROR
// carrying the whole message ("executeLocalTransaction but state
// unexpected"), so answering the probe from the listener made every
// healthy Start log an error. For a half whose send reports a flush
// timeout the client answers ROLLBACK itself, silently; the probe's result
// is reported that way. Real sends pass through untouched, and a failed
// probe send stays an error.
func probeRollback(prop string) primitive.Interceptor {
	return func(ctx context.Context, req, reply any, next primitive.Invoker) error {
		err := next(ctx, req, reply)
		m, _ := req.(*primitive.Message)
		r, _ := reply.(*primitive.SendResult)
		if err == nil && m != nil && r != nil && r.Status == primitive.SendOK && m.GetProperty(prop) != "" {
			r.Status = primitive.SendFlushDiskTimeout
		}
		return err
	}
}

// heartbeatNow makes the client heartbeat every broker in its route table
// now, and returns once they answered. The client has no public API for it
// (see internalClient). It reports false, having done nothing, when the
// client's layout differs.
func heartbeatNow(tp rocketmq.TransactionProducer) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	hb, ok := internalClient(tp).(interface{ SendHeartbeatToAllBrokerWithLock() })
	if !ok {
		return false
	}
	hb.SendHeartbeatToAllBrokerWithLock()
	return true
}

// refreshRoutes makes the client read the routes of its topics from the
// name server now (it does every 30 s), which puts a broker that came back
// into the table heartbeatNow walks: while a broker of a cluster is away,
// the client's next heartbeat drops it from that table. It reports false,
// having done nothing, when the client's layout differs.
func refreshRoutes(tp rocketmq.TransactionProducer) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	r, ok := internalClient(tp).(interface{ UpdateTopicRouteInfo() })
	if !ok {
		return false
	}
	r.UpdateTopicRouteInfo()
	return true
}

// internalClient returns the client instance behind tp (rocketmq-client-go's
// internal RMQClient), or nil when the layout differs.
//
// Upstream lacks it (no upstream issue found): the public
// TransactionProducer offers only Start, Shutdown and
// SendMessageInTransaction, and none of them heartbeats (a producer
// heartbeats at once only in Request, for a topic it has never seen, and a
// transaction producer has no Request); nor is there a call to refresh the
// routes. So the client is reached by reflection and unsafe, on the
// unmodified upstream layout of the pinned version (transactionProducer's
// field producer, defaultProducer's field client): it only reads the
// client field, which is set once at construction, and the callers use
// methods that take the client's own locks, as its timers do.
// TestHeartbeatNowFindsTheClient (txproducer) fails when an upgrade
// changes that layout.
func internalClient(tp rocketmq.TransactionProducer) (client any) { return clientOf(tp) }
