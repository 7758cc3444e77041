package txproducer

import (
	"errors"

	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/otelx"
)

// runLocalTraced is runLocal inside the local-transaction span; it ends the
// half message's span first.
func (p *Producer) runLocalTraced(c *call, half string) broker.LocalTransactionState {
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
func endHalf(sp otelx.Span, sr *broker.TransactionSendResult, err error) {
	var r *broker.SendResult
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
	{ErrForcedRollback, "forced_rollback"},
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
