package consumer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/rmqmsg"
)

// Handler applies one event's business effect inside tx. The dedup row is
// already in tx; returning nil commits both, returning an error rolls both
// back and the error's class (errclass.ClassOf; an unclassified error is
// Unknown) decides what happens next. A handler must not commit or roll
// back tx, and must not have side effects outside tx (send those through a
// command outbox written in tx). It records what it did with
// ev.SetResultRef.
type Handler func(ctx context.Context, tx *sqlx.Tx, ev Event) error

// Event is a decoded rmqtx message as handed to a Handler.
type Event struct {
	ID               string
	Type             string
	Version          int // schema version of the payload (0 = unset)
	AggregateType    string
	AggregateID      string
	AggregateVersion int64 // 0 = unversioned: no version guard
	BusinessKey      string
	Payload          []byte
	Headers          map[string]string
	// PayloadHash is the hex SHA-256 of Payload (the dedup identity, I5).
	PayloadHash string
	Delivery    Delivery

	// handling is the call of the Handler this Event was handed to (nil
	// for any other Event): where SetResultRef records its reference.
	handling *handling
	// counted: this delivery's attempt was counted before its handler ran
	// (crash counting, Processor.countAttempt), so its attempt row exists.
	counted bool
	// cleared: the event's attempt row was deleted with its batch's commit
	// (clearBatchAttempts), so nothing after it needs to delete it again.
	cleared bool
}

// Delivery is where and how the broker delivered the message.
type Delivery struct {
	Topic          string // the original topic, also for retried messages
	BrokerName     string // the broker of the queue the message came from ("" when not known)
	QueueID        int
	QueueOffset    int64
	MsgID          string
	ReconsumeTimes int // 0 on the first delivery
	BornAt         time.Time
	StoredAt       time.Time

	// queueTopic is the topic of the queue the message was pulled from
	// (a %RETRY% topic for a retried message), set by MessageFromExt only:
	// with BrokerName, QueueID and QueueOffset it places a first delivery
	// in its queue's crash-count window (window.go).
	queueTopic string
}

// Message is the raw input of Processor.Process: a body, its properties and
// where it came from. MessageFromExt builds one from a client message.
type Message struct {
	Body       []byte
	Properties map[string]string
	Delivery   Delivery
}

// propReconsume carries the attempt number on messages that rmqtx re-sends to
// the retry topic itself (batch mode), where the broker's count stays 0.
const propReconsume = "RMQTX_RECONSUME_TIMES"

// MessageFromExt converts a message delivered by rocketmq-client-go.
func MessageFromExt(m *rmqmsg.MessageExt) Message {
	d := Delivery{
		Topic:          m.Topic,
		QueueOffset:    m.QueueOffset,
		MsgID:          m.MsgId,
		ReconsumeTimes: int(m.ReconsumeTimes),
		BornAt:         time.UnixMilli(m.BornTimestamp).UTC(),
		StoredAt:       time.UnixMilli(m.StoreTimestamp).UTC(),
	}
	if rt := m.GetProperty(broker.PropRetryTopic); rt != "" && strings.HasPrefix(d.Topic, "%RETRY%") {
		d.Topic = rt
	}
	if m.Queue != nil {
		d.QueueID, d.BrokerName, d.queueTopic = m.Queue.QueueId, m.Queue.BrokerName, m.Topic
	}
	if n, err := strconv.Atoi(m.GetProperty(propReconsume)); err == nil && n > d.ReconsumeTimes {
		d.ReconsumeTimes = n
	}
	return Message{Body: m.Body, Properties: m.GetProperties(), Delivery: d}
}

// maxResultRef is the length of the consume log's result_ref column.
const maxResultRef = 255

// handling is one call of a Handler: the result reference it set, and
// whether it has returned. A Handler may hand its Event to goroutines, so
// it is guarded.
type handling struct {
	mu   sync.Mutex
	ref  string
	done bool
}

func (h *handling) set(ref string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return false
	}
	h.ref = clip(ref, maxResultRef)
	return true
}

// finish ends the call: later SetResultRef calls fail. It returns the
// reference to record ("" for none).
func (h *handling) finish() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.done = true
	return h.ref
}

// SetResultRef records a short reference to the event's effect (an order
// id, a row id) in the consume log's result_ref column, in the handler's
// transaction: it is committed with the effect, or not at all. Call it from
// the Handler on the Event the Handler received; a later call replaces the
// reference, and "" clears it. Values longer than 255 characters are
// truncated.
//
// It returns an error wrapping ErrNotInHandler, and records nothing, for an
// Event no Handler received (one built by hand, or passed to Validate) and
// once the Handler has returned.
func (e Event) SetResultRef(ref string) error {
	if e.handling == nil || !e.handling.set(ref) {
		return fmt.Errorf("%w (event %s)", ErrNotInHandler, e.ID)
	}
	return nil
}

type handlingKey struct{}

// SetResultRef records ref as the result reference of the event whose
// Handler was given ctx (or a context derived from it), like
// Event.SetResultRef. With any other context, or after the Handler
// returned, it does nothing and says nothing.
//
// Deprecated: use Event.SetResultRef on the Event the Handler received,
// which returns ErrNotInHandler instead of doing nothing.
func SetResultRef(ctx context.Context, ref string) {
	if h, ok := ctx.Value(handlingKey{}).(*handling); ok {
		h.set(ref)
	}
}
