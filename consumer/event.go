package consumer

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/jmoiron/sqlx"
)

// Handler applies one event's business effect inside tx. The dedup row is
// already in tx; returning nil commits both, returning an error rolls both
// back and the error's class (see ClassOf) decides what happens next. A
// handler must not commit or roll back tx, and must not have side effects
// outside tx (send those through a command outbox written in tx).
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
}

// Delivery is where and how the broker delivered the message.
type Delivery struct {
	Topic          string // the original topic, also for retried messages
	QueueID        int
	QueueOffset    int64
	MsgID          string
	ReconsumeTimes int // 0 on the first delivery
	BornAt         time.Time
	StoredAt       time.Time
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
func MessageFromExt(m *primitive.MessageExt) Message {
	d := Delivery{
		Topic:          m.Topic,
		QueueOffset:    m.QueueOffset,
		MsgID:          m.MsgId,
		ReconsumeTimes: int(m.ReconsumeTimes),
		BornAt:         time.UnixMilli(m.BornTimestamp).UTC(),
		StoredAt:       time.UnixMilli(m.StoreTimestamp).UTC(),
	}
	if rt := m.GetProperty(primitive.PropertyRetryTopic); rt != "" && strings.HasPrefix(d.Topic, "%RETRY%") {
		d.Topic = rt
	}
	if m.Queue != nil {
		d.QueueID = m.Queue.QueueId
	}
	if n, err := strconv.Atoi(m.GetProperty(propReconsume)); err == nil && n > d.ReconsumeTimes {
		d.ReconsumeTimes = n
	}
	return Message{Body: m.Body, Properties: m.GetProperties(), Delivery: d}
}

type resultRefKey struct{}

type resultRef struct{ ref string }

// SetResultRef records a short reference to the effect (an order id, a row
// id) in the consume log's result_ref column, in the same transaction. Call
// it from a Handler with the ctx it was given; elsewhere it does nothing.
// Values longer than 255 bytes are truncated.
func SetResultRef(ctx context.Context, ref string) {
	if h, ok := ctx.Value(resultRefKey{}).(*resultRef); ok {
		if len(ref) > 255 {
			ref = ref[:255]
		}
		h.ref = ref
	}
}
