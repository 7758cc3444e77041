package discard_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rmqtx/rmqtx/txlog"
)

// fakeLog is an in-memory txlog for decision-rule unit tests. The real
// store's locking behaviour is covered by txlog's and txproducer's
// integration tests, and recovery's by the tests on the real broker here.
type fakeLog struct {
	mu        sync.Mutex
	rows      map[string]txlog.Row
	getErr    error
	recovered map[string]txlog.RecoveryDecision
	marks     int          // successful MarkRecovered calls
	failGets  atomic.Int64 // fail this many Gets first
	failMarks atomic.Int64 // fail this many MarkRecovered first
}

func newFakeLog() *fakeLog {
	return &fakeLog{rows: map[string]txlog.Row{}, recovered: map[string]txlog.RecoveryDecision{}}
}

func (f *fakeLog) Get(_ context.Context, id string) (txlog.Row, error) {
	if f.failGets.Add(-1) >= 0 {
		return txlog.Row{}, errors.New("connection refused")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return txlog.Row{}, f.getErr
	}
	r, ok := f.rows[id]
	if !ok {
		return txlog.Row{}, txlog.ErrNotFound
	}
	return r, nil
}

func (f *fakeLog) Record(_ context.Context, r txlog.Row) (txlog.Row, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if old, ok := f.rows[r.EventID]; ok {
		return old, false, nil
	}
	f.rows[r.EventID] = r
	return r, true, nil
}

func (f *fakeLog) Fence(ctx context.Context, r txlog.Row) (txlog.Row, bool, error) {
	r.State = txlog.StateRolledBack
	if r.ResolvedBy == "" {
		r.ResolvedBy = txlog.ByFence
	}
	return f.Record(ctx, r)
}

func (f *fakeLog) MarkRecovered(_ context.Context, id string, d txlog.RecoveryDecision, note string) error {
	if f.failMarks.Add(-1) >= 0 {
		return errors.New("connection refused")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.rows[id]
	if !ok {
		return txlog.ErrNotFound
	}
	r.RecoveryDecision, r.RecoveryNote, r.RecoveredAt = d, note, time.Now()
	f.rows[id] = r
	f.recovered[id] = d
	f.marks++
	return nil
}

func (f *fakeLog) row(id string) txlog.Row {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rows[id]
}
