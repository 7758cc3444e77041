package txproducer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// The client ends a transaction with a one-way END_TRANSACTION and returns
// at once, so the broker may store a committed event after the next event
// of its aggregate, sent by the next Send or by the outbox the moment Send
// returned: a consumer then sees version 2 before version 1 on the
// aggregate's one queue. For a Send with a routing key (an aggregate or a
// business key, see wire.RoutingKey) rmqtx therefore ends a committed
// transaction itself, with a request the broker answers once it has stored
// the event, and only then returns. The half is sent with the seam's
// SendHalf, which leaves the end to rmqtx (sendInTransaction in
// producer.go): the client's SendMessageInTransaction would end it as well,
// one-way, and the broker ignores such an UNKNOWN end but logs a WARN line
// per Send ("end transaction in sending message, and it's pending status").
// A keyed Send that rolls back ends with a ROLLBACK request, one that
// answers UNKNOWN sends no end (the check decides). A Send without a
// routing key has no order to keep and keeps the client's one-way end.
//
// The request is never repeated: a second COMMIT would store the event a
// second time. When it fails, the outcome is the same as a lost one-way
// end: the broker checks the half, and the check answers COMMIT from the
// txlog. Order is then kept only if the check comes first, so it is logged.

// reqEndTransaction is END_TRANSACTION.
const reqEndTransaction = 37

// ender sends END_TRANSACTION COMMIT for keyed Sends over pooled
// connections to the master brokers of their topics.
type ender struct {
	nameServers []string
	group       string
	timeout     time.Duration
	pool        remoting.Pool

	mu    sync.Mutex
	addrs map[string]string // broker name -> master address
}

func newEnder(nameServers []string, group string, timeout time.Duration) *ender {
	return &ender{nameServers: nameServers, group: group, timeout: timeout, addrs: map[string]string{}}
}

// errEndRefused wraps a broker's non-success answer to our END_TRANSACTION.
var errEndRefused = errors.New("txproducer: broker refused END_TRANSACTION")

// commit ends the transaction of sr (a half of topic) with COMMIT and waits
// for the broker's answer.
func (e *ender) commit(topic string, sr *broker.TransactionSendResult) error {
	return e.end(topic, sr, broker.TransactionCommitType)
}

// rollback ends the transaction of sr with ROLLBACK and waits for the
// broker's answer. Unlike a second COMMIT, a second ROLLBACK stores
// nothing; it is still sent once, as the client's own end would be.
func (e *ender) rollback(topic string, sr *broker.TransactionSendResult) error {
	return e.end(topic, sr, broker.TransactionRollbackType)
}

func (e *ender) end(topic string, sr *broker.TransactionSendResult, kind int) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.timeout)
	defer cancel()
	if sr == nil || sr.SendResult == nil || sr.MessageQueue == nil {
		return errors.New("txproducer: no send result to end")
	}
	addr, err := e.addr(ctx, topic, sr.MessageQueue.BrokerName)
	if err != nil {
		return err
	}
	id := sr.OffsetMsgID
	if id == "" {
		id = sr.MsgID
	}
	mid, err := broker.UnmarshalMsgID([]byte(id))
	if err != nil {
		return fmt.Errorf("txproducer: end transaction: message id %q: %w", id, err)
	}
	ext := map[string]string{
		"producerGroup":        e.group,
		"tranStateTableOffset": strconv.FormatInt(sr.QueueOffset, 10),
		"commitLogOffset":      strconv.FormatInt(mid.Offset, 10),
		"commitOrRollback":     strconv.Itoa(kind),
		"fromTransactionCheck": "false",
		"msgId":                sr.MsgID,
		"transactionId":        sr.TransactionID,
		"bname":                sr.MessageQueue.BrokerName,
	}
	h, _, err := e.pool.RoundTrip(ctx, addr, e.timeout, reqEndTransaction, ext)
	if err != nil {
		e.forget(sr.MessageQueue.BrokerName, addr)
		return fmt.Errorf("txproducer: end transaction at %s: %w", addr, err)
	}
	if h.Code != remoting.ResSuccess {
		return fmt.Errorf("%w: %s answered code %d: %s", errEndRefused, addr, h.Code, h.Remark)
	}
	return nil
}

// addr returns the master address of broker, from the topic's route (read
// once per broker name, again after a failure).
func (e *ender) addr(ctx context.Context, topic, broker string) (string, error) {
	e.mu.Lock()
	a, ok := e.addrs[broker]
	e.mu.Unlock()
	if ok {
		return a, nil
	}
	route, err := remoting.TopicRoute(ctx, e.nameServers, e.timeout, topic)
	if err != nil {
		return "", fmt.Errorf("txproducer: end transaction: route of %s: %w", topic, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range route {
		e.addrs[b.Name] = b.Addr
	}
	if a, ok = e.addrs[broker]; !ok {
		return "", fmt.Errorf("txproducer: end transaction: broker %s not in the route of %s", broker, topic)
	}
	return a, nil
}

func (e *ender) forget(broker, addr string) {
	e.mu.Lock()
	delete(e.addrs, broker)
	e.mu.Unlock()
	e.pool.Forget(addr)
}

func (e *ender) close() { e.pool.Close() }
