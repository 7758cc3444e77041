package txproducer

import (
	"context"
	"encoding/json"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/txlog"
)

// Several half messages can carry one event id: a Send retried with the same
// id, two Sends racing, a Send after a crash. Only one of them committed, and
// the txlog row records which: the local transaction stores the half's
// UNIQ_KEY (the client's message id, which the broker keeps through every
// check) with the row's properties. A check of any other half must answer
// ROLLBACK, or the broker writes the event a second time.

// halfKeyCtx carries the UNIQ_KEY of the half message a check is about.
type halfKeyCtx struct{}

func withHalf(ctx context.Context, m *primitive.MessageExt) context.Context {
	return context.WithValue(ctx, halfKeyCtx{}, m.GetProperty(primitive.PropertyUniqueClientMessageIdKeyIndex))
}

// committedHalf returns the UNIQ_KEY of the half whose local transaction
// wrote row, or "" when the row does not say (fence rows, older rows).
func committedHalf(row txlog.Row) string {
	if row.Properties == "" {
		return ""
	}
	var props map[string]string
	if json.Unmarshal([]byte(row.Properties), &props) != nil {
		return ""
	}
	return props[primitive.PropertyUniqueClientMessageIdKeyIndex]
}

// halfLog is the txlog as the half message of a check sees it (the
// checkback.Log the producer's checker reads): a COMMITTED row that another
// half committed reads as ROLLED_BACK. The decision still comes from the
// persisted row alone; the message only says which half is asking.
type halfLog struct{ s *txlog.Store }

func view(ctx context.Context, row txlog.Row) txlog.Row {
	half, _ := ctx.Value(halfKeyCtx{}).(string)
	if row.State == txlog.StateCommitted && half != "" {
		if b := committedHalf(row); b != "" && b != half {
			row.State = txlog.StateRolledBack
		}
	}
	return row
}

func (h halfLog) Get(ctx context.Context, id string) (txlog.Row, error) {
	row, err := h.s.Get(ctx, id)
	return view(ctx, row), err
}

func (h halfLog) Record(ctx context.Context, r txlog.Row) (txlog.Row, bool, error) {
	row, ins, err := h.s.Record(ctx, r)
	return view(ctx, row), ins, err
}

func (h halfLog) Fence(ctx context.Context, r txlog.Row) (txlog.Row, bool, error) {
	row, ins, err := h.s.Fence(ctx, r)
	return view(ctx, row), ins, err
}
