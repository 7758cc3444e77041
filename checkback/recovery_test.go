package checkback_test

import (
	"context"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/internal/envelope"
	"github.com/rmqtx/rmqtx/txlog"
)

type fakePublisher struct{ sent []*primitive.Message }

func (p *fakePublisher) SendSync(_ context.Context, msgs ...*primitive.Message) (*primitive.SendResult, error) {
	p.sent = append(p.sent, msgs...)
	return &primitive.SendResult{Status: primitive.SendOK, MsgID: "m1"}, nil
}

// discarded builds a message as the broker stores it in DiscardTopic.
func discarded(group, id string, body []byte) *primitive.MessageExt {
	m := &primitive.MessageExt{Message: primitive.Message{Topic: checkback.DiscardTopic, Body: body}}
	props := envelope.Envelope{EventID: id, EventType: "T"}.Properties(body)
	for k, v := range map[string]string{
		"REAL_TOPIC": "orders", "REAL_QID": "0", "TRAN_MSG": "true", "PGROUP": group, "UNIQ_KEY": "u1",
		"__transactionId__": "u1", "TRANSACTION_CHECK_TIMES": "5", "KEYS": id, "TAGS": "tag",
	} {
		props[k] = v
	}
	m.WithProperties(props) // replaces the whole map
	return m
}

func recovery(t *testing.T, log checkback.RecoveryLog, pub checkback.Publisher) *checkback.Recovery {
	t.Helper()
	r, err := checkback.NewRecovery(checkback.RecoveryConfig{NameServer: []string{"127.0.0.1:9876"}, Group: "g", Log: log, Publisher: pub})
	require.NoError(t, err)
	return r
}

func TestRecoveryDecisions(t *testing.T) {
	t.Parallel()
	body := []byte(`{"a":1}`)
	log := newFakeLog()
	log.rows["c"] = txlog.Row{EventID: "c", State: txlog.StateCommitted, PayloadHash: envelope.Hash(body)}
	log.rows["r"] = txlog.Row{EventID: "r", State: txlog.StateRolledBack}
	log.rows["x"] = txlog.Row{EventID: "x", State: txlog.StateCommitted, PayloadHash: "other"}
	pub := &fakePublisher{}
	r := recovery(t, log, pub)
	ctx := context.Background()

	res, err := r.Handle(ctx, discarded("g", "c", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryRepublished, res.Decision)
	require.Len(t, pub.sent, 1)
	m := pub.sent[0]
	require.Equal(t, "orders", m.Topic)
	require.Equal(t, body, m.Body)
	require.Equal(t, "c", m.GetProperty(envelope.PropEventID), "same event id")
	require.Equal(t, "u1", m.GetProperty("UNIQ_KEY"))
	require.Equal(t, "tag", m.GetTags())
	for _, k := range []string{"TRAN_MSG", "PGROUP", "REAL_TOPIC", "REAL_QID", "__transactionId__", "TRANSACTION_CHECK_TIMES"} {
		require.Empty(t, m.GetProperty(k), k)
	}
	// A second discarded copy of the same transaction is not published again.
	res, err = r.Handle(ctx, discarded("g", "c", body))
	require.NoError(t, err)
	require.Empty(t, res.Decision)
	require.Len(t, pub.sent, 1)

	res, err = r.Handle(ctx, discarded("g", "r", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryDropped, res.Decision)

	res, err = r.Handle(ctx, discarded("g", "missing", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryFenced, res.Decision)
	require.Equal(t, txlog.StateRolledBack, log.rows["missing"].State)
	require.Equal(t, txlog.ByRecovery, log.rows["missing"].ResolvedBy)

	res, err = r.Handle(ctx, discarded("g", "x", body))
	require.NoError(t, err)
	require.Equal(t, txlog.RecoveryConflict, res.Decision)

	res, err = r.Handle(ctx, discarded("other-group", "c2", body))
	require.NoError(t, err)
	require.Empty(t, res.Decision)
	require.Len(t, pub.sent, 1, "nothing else was published")
	require.Equal(t, map[string]txlog.RecoveryDecision{"c": txlog.RecoveryRepublished, "r": txlog.RecoveryDropped,
		"missing": txlog.RecoveryFenced, "x": txlog.RecoveryConflict}, log.recovered)
}

func TestRecoveryRetriesOnDatabaseError(t *testing.T) {
	t.Parallel()
	log := newFakeLog()
	log.getErr = context.DeadlineExceeded
	r := recovery(t, log, &fakePublisher{})
	_, err := r.Handle(context.Background(), discarded("g", "c", []byte("x")))
	require.Error(t, err, "a database error asks for redelivery")
}

func TestRecoveryShutdownIdempotent(t *testing.T) {
	t.Parallel()
	r := recovery(t, newFakeLog(), &fakePublisher{})
	require.NoError(t, r.Shutdown(context.Background()))
	require.NoError(t, r.Close())
	require.Error(t, r.Start(context.Background()))
}
