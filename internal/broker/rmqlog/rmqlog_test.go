package rmqlog_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/jmoiron/sqlx"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/rmqlog"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txproducer"
)

const card = "4111111111111111"

// routeMu serialises the tests that swap the client's global logger.
var routeMu sync.Mutex

// capture routes the client's global logger into a Trace-level logger with a
// test hook for the duration of the test.
func capture(t *testing.T) (*logrus.Logger, *test.Hook) {
	t.Helper()
	routeMu.Lock()
	l, hook := test.NewNullLogger()
	l.SetLevel(logrus.TraceLevel)
	rmqlog.Route(l)
	t.Cleanup(func() {
		rmqlog.Route(nil)
		routeMu.Unlock()
	})
	return l, hook
}

// rendered is every way an entry reaches a log sink: logrus's text and JSON
// formatters and fmt's %+v of its fields.
func rendered(t *testing.T, e *logrus.Entry) string {
	t.Helper()
	txt, err := (&logrus.TextFormatter{DisableColors: true}).Format(e)
	require.NoError(t, err)
	js, err := (&logrus.JSONFormatter{}).Format(e)
	require.NoError(t, err)
	return string(txt) + string(js) + e.Message + fmt.Sprintf("%+v %v", e.Data, e.Data)
}

func requireNoCard(t *testing.T, entries []*logrus.Entry) {
	t.Helper()
	for k := range entries {
		s := rendered(t, entries[k])
		require.NotContains(t, s, card, "entry %d at %s leaks the payload:\n%s", k, entries[k].Level, s)
	}
}

func message(topic string) *primitive.Message {
	m := &primitive.Message{}
	fill(m, topic)
	return m
}

func fill(m *primitive.Message, topic string) {
	m.Topic = topic
	m.Body = []byte(`{"order":"o-1","card":"` + card + `","note":"a, Flag=1, properties=x"}`)
	m.WithKeys([]string{"evt-1", card})
	m.WithTag("paid")
	m.WithProperty("RMQTX_EVENT_ID", "evt-1")
	m.WithProperty("rmqtx.h.card", card)
	m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, "AC11000100002A9F")
}

func messageExt(topic string) *primitive.MessageExt {
	m := &primitive.MessageExt{MsgId: "AC11000100002A9F", OffsetMsgId: "7F00000100002A9F", QueueOffset: 41, ReconsumeTimes: 2}
	fill(&m.Message, topic)
	m.Queue = &primitive.MessageQueue{Topic: topic, BrokerName: "broker-a", QueueId: 1}
	return m
}

// responseLike has the shape of the client's *remote.RemotingCommand (logged
// as "response" when locking a queue fails): a Body and a String without it.
type responseLike struct {
	Code      int
	Body      []byte
	ExtFields map[string]string
}

func (r *responseLike) String() string {
	return fmt.Sprintf("Code: %d, ExtFields: %v", r.Code, r.ExtFields)
}

// The exact shapes rocketmq-client-go logs (producer/producer.go,
// consumer/push_consumer.go, consumer/pull_consumer.go, consumer/consumer.go)
// leave no body and no payload-derived property at any level, through the
// text and the JSON formatter, while the identifying parts remain.
func TestScrubClientShapes(t *testing.T) {
	_, hook := capture(t)
	mq := &primitive.MessageQueue{Topic: "orders", BrokerName: "broker-a", QueueId: 1}
	exts := []*primitive.MessageExt{messageExt("orders"), messageExt("orders")}
	handlerErr := fmt.Errorf("handler: cannot decode body=%s", card)

	// producer/producer.go: every rolled-back local transaction.
	rlog.Error("executeLocalTransaction but state unexpected", map[string]interface{}{
		"localState": primitive.RollbackMessageState,
		"message":    message("orders"),
	})
	// consumer/push_consumer.go: consume errors and timeouts, concurrently.
	rlog.Warning("consumeMessageCurrently error", map[string]interface{}{
		rlog.LogKeyUnderlayError: handlerErr,
		rlog.LogKeyMessages:      exts,
		rlog.LogKeyMessageQueue:  mq,
		rlog.LogKeyConsumerGroup: "points",
	})
	rlog.Warning("consumeMessageCurrently time out", map[string]interface{}{
		rlog.LogKeyMessages:      exts,
		rlog.LogKeyMessageQueue:  mq,
		rlog.LogKeyConsumerGroup: "points",
	})
	rlog.Warning("BROADCASTING, the message consume failed, drop it", map[string]interface{}{"message": exts[0]})
	rlog.Warning("processQueue is dropped without process consume result.", map[string]interface{}{
		rlog.LogKeyMessageQueue: mq,
		"message":               exts,
	})
	// ... and orderly.
	rlog.Warning("consumeMessage orderly error", map[string]interface{}{
		rlog.LogKeyUnderlayError: handlerErr,
		rlog.LogKeyMessages:      exts,
		rlog.LogKeyMessageQueue:  mq.String(),
		rlog.LogKeyConsumerGroup: "points",
	})
	rlog.Warning("consumeMessage Orderly return not OK", map[string]interface{}{
		rlog.LogKeyConsumerGroup: "points",
		"messages":               exts,
		rlog.LogKeyMessageQueue:  mq,
	})
	// consumer/pull_consumer.go.
	rlog.Warning("defaultPullConsumer processQueue is dropped without process consume result.", map[string]interface{}{
		rlog.LogKeyMessageQueue: mq,
		"message":               exts,
	})
	// consumer/consumer.go: a response (remoting command) with a body.
	rlog.Error("lock MessageQueue to broker invoke error", map[string]interface{}{
		rlog.LogKeyBroker: "127.0.0.1:10911",
		"response":        &responseLike{Code: 1, Body: []byte(card), ExtFields: map[string]string{"properties": "KEYS\x01" + card}},
	})
	// Values and text in other shapes, at the other levels.
	var value primitive.Message
	value.Topic, value.Body = "orders", []byte(card)
	rlog.Debug("debug "+message("orders").String(), map[string]interface{}{
		"value":      reflect.ValueOf(&value).Elem().Interface(), // a Message value, not a pointer
		"ext":        reflect.ValueOf(exts[0]).Elem().Interface(),
		"raw":        []byte(card),
		"json":       json.RawMessage(`{"card":"` + card + `"}`),
		"props":      message("orders").GetProperties(),
		"text":       exts[0].String(),
		"structText": fmt.Sprintf("%+v", struct{ Body []byte }{[]byte(card)}),
		"jsonText":   `{"Topic":"orders","Body":"` + card + `"}`,
	})
	rlog.Info("info", map[string]interface{}{"message": message("orders"), "body": "Body: " + card})
	rlog.Fatal("fatal body="+card, nil)

	entries := hook.AllEntries()
	require.Len(t, entries, 12)
	requireNoCard(t, entries)

	first := rendered(t, entries[0])
	require.Equal(t, logrus.DebugLevel, entries[0].Level, "a rollback is an ordinary outcome")
	require.Contains(t, first, "topic=orders", "the summary keeps the topic")
	require.Contains(t, first, "bodySize=", "and the body's size")
	require.Contains(t, first, "RMQTX_EVENT_ID=evt-1", "and rmqtx's event id")
	require.Contains(t, first, "UNIQ_KEY=AC11000100002A9F")
	second := rendered(t, entries[1])
	require.Contains(t, second, "msgId=AC11000100002A9F")
	require.Contains(t, second, "queueOffset=41")
	require.Contains(t, second, "handler: cannot decode body=")
	asErr, ok := entries[1].Data[rlog.LogKeyUnderlayError].(error)
	require.True(t, ok, "an error field stays an error")
	require.False(t, errors.Is(asErr, handlerErr), "but its text is scrubbed")
	require.Equal(t, logrus.DebugLevel, entries[10].Level, "Info is logged at debug")
	require.Equal(t, logrus.ErrorLevel, entries[11].Level, "Fatal is logged as an error")
}

func TestScrubText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"no payload here", "no payload here"},
		{"[topic=t, body=" + card + ", Flag=0, properties=KEYS\x01" + card + "\x02, TransactionId=x]",
			"[topic=t, body=<redacted>, TransactionId=x]"},
		{"{Topic:t Body:[52 49 49] Flag:0}", "{Topic:t Body:[<redacted>] Flag:0}"},
		{`{"Topic":"t","Body":"NDEx","Flag":0}`, `{"Topic":"t","Body":"<redacted>","Flag":0}`},
		{"request body: " + card + " rest", "request body: <redacted>"},
		{"BodyCRC=12, BodyLength=3", "BodyCRC=12, BodyLength=3"},
		{"ExtFields: map[properties:KEYS\x01" + card + "]", "ExtFields: map[<redacted>]"},
		// Structure without a label: fmt's byte lists, Go syntax, maps.
		{"pulled [52 49 49 49] from q [0 1]", "pulled [<redacted>] from q [<redacted>]"},
		{"v=[]byte{0x34, 0x31} w=[16]uint8{0x34}", "v=[]byte{<redacted>} w=[16]uint8{<redacted>}"},
		{`h=map[string]string{"card":"` + card + `"} rest`, "h=map[<redacted>} rest"},
		{"{orders 0 map[a:b] {x} map[KEYS:" + card + "] ] tail", "{orders 0 map[<redacted>] tail"},
		{"no map here: [1000 2000]", "no map here: [1000 2000]"},
	} {
		require.Equal(t, tc.want, rmqlog.ScrubText(tc.in), tc.in)
	}
}

// A real rollback on the real broker: the local transaction of a
// transactional Send fails, the client logs the message at error level, and
// nothing of the payload (a card number) reaches the logger at any level.
// The Send has no business key or aggregate: a keyed Send ends its
// transaction itself and the client never sees the local outcome
// (txproducer's endsync.go), so only a keyless one makes the client log it.
func TestRealRollbackLeaksNoPayload(t *testing.T) {
	s := testenv.Integration(t)
	l, hook := capture(t)
	db := testenv.DB(t)
	ctx := context.Background()
	topic := testenv.Name(t, "pay")
	testenv.CreateTopic(t, topic, 1)

	p, err := txproducer.New(txproducer.Config{NameServers: []string{s.NameServer}, Group: testenv.Name(t, "ptx"), DB: db,
		Observe: observe.Observe{Logger: l}, DisableRecovery: true, FenceAge: 4 * time.Second, LocalTxTimeout: 3 * time.Second}) // fits the test broker's check timing
	require.NoError(t, err)
	require.NoError(t, schema.MigrateAll(ctx, db, ""))
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() { _ = p.Close() })

	res, err := p.Send(ctx, txproducer.Message{Topic: topic, EventType: "PaymentCaptured",
		Headers: map[string]string{"card": card}, Payload: []byte(`{"order":"order-7","card":"` + card + `","amount":1999}`)},
		func(ctx context.Context, tx *sqlx.Tx) error {
			if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
				return err
			}
			return errors.New("card declined")
		})
	require.Error(t, err)
	require.Equal(t, txproducer.StateRolledBack, res.State)

	// The client logs the rollback on the Send goroutine before it returns;
	// poll anyway in case a later client moves it.
	var rollback *logrus.Entry
	testenv.Eventually(t, 10*time.Second, "the client's rollback log line", func() bool {
		for _, e := range hook.AllEntries() {
			if strings.Contains(e.Message, "executeLocalTransaction but state unexpected") {
				rollback = e
				return true
			}
		}
		return false
	})
	require.Equal(t, logrus.DebugLevel, rollback.Level, "a declined card is an ordinary outcome, not an error")
	require.Contains(t, rendered(t, rollback), "topic="+topic, "the line still says which message")
	requireNoCard(t, hook.AllEntries())
}

// Route swaps the logger while the client's goroutines log (tests and
// services re-route at run time): rlog's global is set once, so this is no
// data race (run with -race).
func TestRouteWhileLogging(t *testing.T) {
	_, hook := capture(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				rlog.Error("executeLocalTransaction but state unexpected", map[string]interface{}{"message": message("orders")})
			}
		}
	}()
	l2, hook2 := test.NewNullLogger()
	for i := 0; i < 100; i++ {
		rmqlog.Route(l2)
		rmqlog.Route(nil)
	}
	rmqlog.Route(l2)
	testenv.Eventually(t, 5*time.Second, "a line through the re-routed logger", func() bool { return len(hook2.AllEntries()) > 0 })
	close(stop)
	<-done
	requireNoCard(t, hook.AllEntries())
	requireNoCard(t, hook2.AllEntries())
}

// TestInstallSaysWhenALoggerIsNotTheClients: the client's logger is
// process-wide; a component whose Logger does not get the client's lines
// is told so on that Logger, once per process, and the one that does is not.
func TestInstallSaysWhenALoggerIsNotTheClients(t *testing.T) {
	routeMu.Lock()
	defer routeMu.Unlock()
	first, firstHook := test.NewNullLogger()
	first.SetLevel(logrus.DebugLevel)
	second, secondHook := test.NewNullLogger()
	third, thirdHook := test.NewNullLogger()
	rmqlog.Route(first)
	rmqlog.ResetElsewhereNotice()
	t.Cleanup(func() { rmqlog.Route(nil) })

	rmqlog.Install(first)
	require.Empty(t, firstHook.AllEntries(), "the client's own logger is not warned")
	rmqlog.Install(second)
	require.Len(t, secondHook.AllEntries(), 1)
	require.Contains(t, secondHook.LastEntry().Message, "RouteClientLog")
	rmqlog.Install(nil)
	require.Len(t, secondHook.AllEntries(), 1, "a quiet component is not told")
	rmqlog.Install(third)
	rmqlog.Install(second)
	require.Empty(t, thirdHook.AllEntries(), "the notice appears once per process")
	require.Len(t, secondHook.AllEntries(), 1, "the notice appears once per process")
}

// TestClientLinesAtTheirLevel feeds the adapter each of the client's known
// lines for an ordinary outcome, and lines for real faults: a rolled-back
// local transaction (every failed or duplicate Send) is not an error, nor
// an unknown one (every keyed commit rmqtx ends itself, or an outcome rmqtx
// logs itself); everything else keeps the client's level.
func TestClientLinesAtTheirLevel(t *testing.T) {
	_, hook := capture(t)
	cases := []struct {
		name string
		log  func()
		want logrus.Level
	}{
		{"rolled-back local transaction", func() {
			rlog.Error("executeLocalTransaction but state unexpected", map[string]interface{}{
				"localState": primitive.RollbackMessageState, "message": message("orders")})
		}, logrus.DebugLevel},
		{"unknown local transaction", func() {
			rlog.Error("executeLocalTransaction but state unexpected", map[string]interface{}{
				"localState": primitive.UnkonwnState, "message": message("orders")})
		}, logrus.DebugLevel},
		{"end transaction lost", func() {
			rlog.Error("send ReqENDTransaction to broker error", map[string]interface{}{"callback": "x"})
		}, logrus.ErrorLevel},
		{"name server unreachable", func() {
			rlog.Error("connect to namesrv failed.", map[string]interface{}{"namesrv": "127.0.0.1:1"})
		}, logrus.ErrorLevel},
		{"pull failed", func() {
			rlog.Warning("pull message from broker error", nil)
		}, logrus.WarnLevel},
	}
	for _, c := range cases {
		hook.Reset()
		c.log()
		entries := hook.AllEntries()
		require.Len(t, entries, 1, c.name)
		require.Equal(t, c.want, entries[0].Level, c.name)
		requireNoCard(t, entries)
	}
}
