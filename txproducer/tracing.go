package txproducer

import (
	"context"
	"errors"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/otelx"
)

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

// runLocalTraced is runLocal inside the local-transaction span; it ends the
// half message's span first.
func (p *Producer) runLocalTraced(c *call, half string) primitive.LocalTransactionState {
	if p.tr == nil {
		return p.runLocal(c, half)
	}
	c.halfSp.SetMsgID(half)
	c.halfSp.End("stored", "")
	parent := c.ctx
	ctx, sp := p.tr.Start(parent, otelx.SpanLocalTx, trace.SpanKindInternal, otelx.Attrs{})
	c.ctx = ctx
	st := p.runLocal(c, half)
	c.ctx = parent
	if c.dup {
		sp.SetReason("duplicate")
	}
	sp.End(c.state.String(), errType(c.err))
	return st
}

// endHalf ends the half message's span after SendMessageInTransaction.
func endHalf(sp otelx.Span, sr *primitive.TransactionSendResult, err error) {
	var r *primitive.SendResult
	if sr != nil {
		r = sr.SendResult
	}
	sp.EndSend(r, err)
}

// errClasses name the class of a Send error on a span (error.type): a fixed
// word per sentinel, never the error's text, which may quote the caller's
// data.
var errClasses = []struct {
	err  error
	name string
}{
	{ErrCommitUnknown, "commit_unknown"},
	{ErrLocalTx, "local_tx"},
	{ErrFenced, "fenced"},
	{ErrEventIDConflict, "event_id_conflict"},
	{ErrDatabase, "database"},
	{ErrSend, "send"},
	{ErrInvalidMessage, "invalid_message"},
	{ErrNotStarted, "not_started"},
	{ErrClosed, "closed"},
}

func errType(err error) string {
	if err == nil {
		return ""
	}
	for _, c := range errClasses {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "other"
}
