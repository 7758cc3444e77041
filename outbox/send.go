package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
)

// Sending: Config.Concurrency senders take units of claimed rows from the
// claim loop, send each in one request through the Sink (a panic in the Sink
// is an unknown outcome) and hand the results to the claim strategy.

func (d *Dispatcher) worker(sendCtx context.Context) {
	defer d.workers.Done()
	for {
		select {
		case <-d.stopWorkers:
			return
		case u := <-d.rowsCh:
			d.sendUnit(sendCtx, u)
			d.held.Add(-int64(len(u)))
			select {
			case d.freed <- struct{}{}:
			default:
			}
		}
	}
}

// sendUnit sends one unit of a claim (a row alone, or one group of the
// BatchSink, all of one claim) in one request and hands each row's own
// outcome to the claim strategy: written in the held claim's transaction
// (heldClaimer.settle), or row by row with the successes left to the
// marker, which writes SENT in a batch (leaseClaimer.settle).
func (d *Dispatcher) sendUnit(sendCtx context.Context, u []claimedRow) {
	msgs := make([]*Message, len(u))
	outs := make([]Outcome, len(u))
	logs := make([]logrus.FieldLogger, len(u))
	for i, r := range u {
		msgs[i] = &Message{Event: r.event(), Attempt: r.RetryCount + 1}
		outs[i] = Outcome{EventID: r.EventID, Destination: r.Destination, EventType: r.EventType, Attempt: msgs[i].Attempt, TookOver: r.tookOver}
		logs[i] = d.cfg.Logger.WithFields(logrus.Fields{"event_id": r.EventID, "destination": r.Destination, "attempt": msgs[i].Attempt})
	}
	// errs stays nil when the unit is not sent. Its rows were claimed at
	// the same instant, so the first one tells whether they waited too long.
	var errs []error
	if d.waitedTooLong(u[0]) {
		logs[0].WithField("rows", len(u)).Info("outbox: claimed rows waited too long for a sender; handed back unsent")
	} else {
		start := time.Now()
		if len(u) == 1 {
			ctx, sp := d.startDispatch(sendCtx, u[0], msgs[0])
			ctx, cancel := context.WithTimeout(ctx, d.cfg.SendTimeout)
			err := d.safeSend(ctx, msgs[0])
			cancel()
			endDispatch(sp, err)
			errs = []error{err}
		} else {
			spans := d.startDispatchBatch(sendCtx, u, msgs)
			ctx, cancel := context.WithTimeout(sendCtx, d.cfg.SendTimeout)
			errs = d.safeSendBatch(ctx, msgs)
			cancel()
			endDispatchBatch(spans, errs)
		}
		if sendCtx.Err() == nil {
			d.observeSend(time.Since(start))
		}
	}
	d.claims.settle(sendCtx, u, outs, errs, logs)
}

// waitedTooLong: the row waited so long for a sender that its lease could
// end before the send does; it is handed back unsent instead.
func (d *Dispatcher) waitedTooLong(r claimedRow) bool {
	return d.maxWait > 0 && time.Since(r.claimedAt) > d.maxWait
}

func (d *Dispatcher) safeSend(ctx context.Context, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = d.sinkPanicked(p, []*Message{m})
		}
	}()
	return d.cfg.Sink.Send(ctx, m)
}

func (d *Dispatcher) safeSendBatch(ctx context.Context, msgs []*Message) (errs []error) {
	defer func() {
		if p := recover(); p != nil {
			errs = nil
			err := d.sinkPanicked(p, msgs)
			for range msgs {
				errs = append(errs, err)
			}
		}
	}()
	errs = d.batch.SendBatch(ctx, msgs)
	if len(errs) != len(msgs) {
		// A sink that broke its contract: nothing is known to be delivered.
		err := Unknown(fmt.Errorf("outbox: sink returned %d results for %d messages", len(errs), len(msgs)))
		errs = make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// sinkPanicked turns a sink's panic into the error of each message it was
// sending. The sink may have sent before it panicked, so the outcome is
// unknown, not transient: the row is retried (a resend carries the same
// event id, a duplicate consumers absorb) and counted as an unknown result in
// rmqtx_outbox_sends_total (settle). A panic is a bug in the sink: it is
// logged at Error with the event ids, never the payloads.
func (d *Dispatcher) sinkPanicked(p any, msgs []*Message) error {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.EventID
	}
	fields := logrus.Fields{"event_ids": ids, "code": codeSinkPanic}
	if len(msgs) == 1 {
		fields = logrus.Fields{"event_id": ids[0], "code": codeSinkPanic}
	}
	err := fmt.Errorf("outbox: sink panicked: %v", rmqlog.ScrubValue(p))
	d.cfg.Logger.WithFields(fields).Error(d.cfg.Redact(err.Error()) + "; the outcome is unknown, the row is retried with the same event id")
	return NewSendError(ClassUnknown, codeSinkPanic, err)
}

// codeSinkPanic is the last_error_code of a send whose sink panicked.
const codeSinkPanic = "sink_panic"
