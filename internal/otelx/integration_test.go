package otelx_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/otelx"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/observe"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// secret is in every payload; no span attribute may contain it.
const secret = "card-4111111111111111"

// traced is an SDK tracer provider that exports every span, as it ends, to
// the SDK's in-memory exporter.
func traced(t *testing.T) (*tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return exp, tp
}

// spansOf returns the ended spans named name whose event id attribute is id.
func spansOf(exp *tracetest.InMemoryExporter, name, id string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name != name {
			continue
		}
		for _, kv := range s.Attributes {
			if kv.Key == otelx.AttrEventID && kv.Value.AsString() == id {
				out = append(out, s)
			}
		}
	}
	return out
}

func waitSpan(t *testing.T, exp *tracetest.InMemoryExporter, name, id string) tracetest.SpanStub {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, name+" span of "+id, func() bool { return len(spansOf(exp, name, id)) > 0 })
	s := spansOf(exp, name, id)
	require.Len(t, s, 1, "%s spans of %s", name, id)
	return s[0]
}

// waitApplied waits for the consume span that applied id and returns it
// with every consume span of id: the broker may deliver a committed event
// twice (a commit and a later check both commit the half), and the second
// copy is a dedup hit with a span of its own in the same trace.
func waitApplied(t *testing.T, exp *tracetest.InMemoryExporter, id string) (applied tracetest.SpanStub, all []tracetest.SpanStub) {
	t.Helper()
	outcome := func(s tracetest.SpanStub) string {
		for _, kv := range s.Attributes {
			if kv.Key == otelx.AttrOutcome {
				return kv.Value.AsString()
			}
		}
		return ""
	}
	var found []tracetest.SpanStub
	testenv.Eventually(t, 60*time.Second, "the consume span that applied "+id, func() bool {
		found = nil
		for _, s := range spansOf(exp, otelx.SpanConsume, id) {
			if outcome(s) == "applied" {
				found = append(found, s)
			}
		}
		return len(found) > 0
	})
	require.Len(t, found, 1, "applied once")
	for _, s := range spansOf(exp, otelx.SpanConsume, id) {
		require.Contains(t, []string{"applied", "duplicate"}, outcome(s))
		all = append(all, s)
	}
	return found[0], all
}

func spanNamed(t *testing.T, exp *tracetest.InMemoryExporter, name string, parent trace.SpanContext) tracetest.SpanStub {
	t.Helper()
	for _, s := range exp.GetSpans() {
		if s.Name == name && s.Parent.SpanID() == parent.SpanID() {
			return s
		}
	}
	t.Fatalf("no %s span under %s", name, parent.SpanID())
	return tracetest.SpanStub{}
}

func requireNoPayload(t *testing.T, exp *tracetest.InMemoryExporter) {
	t.Helper()
	for _, s := range exp.GetSpans() {
		for _, kv := range s.Attributes {
			require.NotContains(t, kv.Value.String(), "4111", "%s %s", s.Name, kv.Key)
		}
		require.NotContains(t, s.Status.Description, "4111", s.Name)
	}
}

// handlerSpans records the span each handler call ran in, by event id.
type handlerSpans struct {
	mu sync.Mutex
	m  map[string]trace.SpanContext
}

func (h *handlerSpans) handler(ctx context.Context, _ *sqlx.Tx, ev consumer.Event) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]trace.SpanContext{}
	}
	h.m[ev.ID] = trace.SpanContextFromContext(ctx)
	return nil
}

func (h *handlerSpans) get(id string) (trace.SpanContext, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sc, ok := h.m[id]
	return sc, ok
}

func startConsumer(t *testing.T, db *sqlx.DB, topic string, tp trace.TracerProvider, h *handlerSpans) {
	t.Helper()
	s := testenv.Integration(t)
	c, err := consumer.New(consumer.Config{
		Group: testenv.Name(t, "cg"), DB: db, Observe: observe.Observe{TracerProvider: tp},
		Routes:      map[string]consumer.Route{"OrderPlaced": {Handler: h.handler}},
		NameServers: []string{s.NameServer},
		Topic:       topic,
	})
	require.NoError(t, err)
	require.NoError(t, c.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, c.Shutdown(ctx))
	})
}

func setupDB(t *testing.T) *sqlx.DB {
	t.Helper()
	db := testenv.DB(t)
	require.NoError(t, schema.MigrateAll(context.Background(), db, ""))
	return db
}

// One trace from txproducer.Send to the consumer's handler across the real
// broker: the caller's request span, the send span under it, the half send
// and the local transaction (the caller's function runs in it) under the
// send, the broker's check answer (the local transaction waits for it) and
// the consume span under the send span, through the traceparent the
// message carries; the handler runs in the consume span. Same trace id
// everywhere, parent/child links as described, the event id and type as
// attributes, never the payload.
func TestTraceSendToHandlerAcrossBroker(t *testing.T) {
	s := testenv.Integration(t)
	db := setupDB(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	coll := testenv.Collect(t, topic)
	exp, tp := traced(t)
	h := &handlerSpans{}
	startConsumer(t, db, topic, tp, h)

	id := wire.NewEventID()
	checked := make(chan struct{})
	var once sync.Once
	p, err := txproducer.New(txproducer.Config{
		NameServers: []string{s.NameServer}, Group: testenv.Name(t, "pg"), DB: db,
		WarmupTopics: []string{topic}, DisableRecovery: true, Observe: observe.Observe{TracerProvider: tp},
		FenceAge: 4 * time.Second, // fits the test bed's short check settings
		OnCheck: func(a checkback.Answer) {
			if a.EventID == id {
				once.Do(func() { close(checked) })
			}
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() { _ = p.Close() })

	reqCtx, req := tp.Tracer("test").Start(context.Background(), "POST /orders")
	var fnSpan trace.SpanContext
	res, err := p.Send(reqCtx, txproducer.Message{
		Topic: topic, EventID: id, EventType: "OrderPlaced", BusinessKey: "order-42", Payload: []byte(`{"pay":"` + secret + `"}`),
	}, func(ctx context.Context, tx *sqlx.Tx) error {
		fnSpan = trace.SpanContextFromContext(ctx)
		// Keep the local transaction open until the broker checks it
		// (transactionTimeOut 3 s on the test bed): the check answer
		// joins the trace too.
		select {
		case <-checked:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	req.End()
	require.NoError(t, err)
	require.Equal(t, txproducer.StateCommitted, res.State)

	consume, copies := waitApplied(t, exp, id)
	testenv.Eventually(t, 30*time.Second, "handler call", func() bool { _, ok := h.get(id); return ok })
	send := waitSpan(t, exp, otelx.SpanSend, id)
	testenv.Eventually(t, 30*time.Second, "check span", func() bool { return len(spansOf(exp, otelx.SpanCheck, id)) > 0 })
	checks := spansOf(exp, otelx.SpanCheck, id) // answered halves are checked again: one or more
	local := spanNamed(t, exp, otelx.SpanLocalTx, send.SpanContext)
	half := spanNamed(t, exp, otelx.SpanHalfSend, send.SpanContext)

	traceID := req.SpanContext().TraceID()
	for _, sp := range append([]tracetest.SpanStub{send, half, local, consume}, checks...) {
		require.Equal(t, traceID, sp.SpanContext.TraceID(), "%s is in the request's trace", sp.Name)
	}
	require.Equal(t, req.SpanContext().SpanID(), send.Parent.SpanID(), "send under the request")
	require.Equal(t, send.SpanContext.SpanID(), half.Parent.SpanID())
	require.Equal(t, send.SpanContext.SpanID(), local.Parent.SpanID())
	for _, check := range checks {
		require.Equal(t, send.SpanContext.SpanID(), check.Parent.SpanID(), "the check answers the Send's half message")
		require.True(t, check.Parent.IsRemote())
	}
	for _, c := range copies {
		require.Equal(t, traceID, c.SpanContext.TraceID(), "every delivered copy is in the trace")
		require.Equal(t, send.SpanContext.SpanID(), c.Parent.SpanID(), "consume under the send, across the broker")
		require.True(t, c.Parent.IsRemote())
	}
	require.Equal(t, local.SpanContext.SpanID(), fnSpan.SpanID(), "the caller's function runs in the local-transaction span")
	hs, _ := h.get(id)
	require.Equal(t, consume.SpanContext.SpanID(), hs.SpanID(), "the handler runs in the consume span")
	require.Equal(t, trace.SpanKindProducer, send.SpanKind)
	require.Equal(t, trace.SpanKindConsumer, consume.SpanKind)

	attr := map[string]string{}
	for _, kv := range consume.Attributes {
		attr[string(kv.Key)] = kv.Value.String()
	}
	require.Equal(t, "OrderPlaced", attr[string(otelx.AttrEventType)])
	require.Equal(t, topic, attr[string(otelx.AttrDestination)])
	require.Equal(t, "applied", attr[string(otelx.AttrOutcome)])
	require.NotContains(t, attr, "rmqtx.business_key")
	requireNoPayload(t, exp)

	// Independently: the copy on the broker carries the send span's
	// context, and the txlog row keeps it for a republish.
	want := "00-" + traceID.String() + "-" + send.SpanContext.SpanID().String() + "-01"
	coll.WaitDistinct(t, 1, 60*time.Second)
	require.Equal(t, want, coll.Message(id).GetProperty(otelx.PropTraceparent))
	require.Equal(t, 1, coll.Snapshot().Distinct(), "one event on the broker")
	row, err := p.Log().Get(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, txlog.StateCommitted, row.State)
	require.Contains(t, row.Properties, want)
}

// One trace per outbox event from the request that enqueued it to the
// handler: the dispatch span is a child of the span Enqueue found in its
// context, and the consume span a child of the dispatch span. Three events
// enqueued under three requests are claimed together (the RocketMQ sink
// sends them as one batch) and still land in three separate traces.
func TestTraceOutboxToHandlerAcrossBroker(t *testing.T) {
	s := testenv.Integration(t)
	db := setupDB(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1) // one queue: the three rows form one batch
	exp, tp := traced(t)
	h := &handlerSpans{}
	startConsumer(t, db, topic, tp, h)

	reqs := map[string]trace.Span{}
	for i := 0; i < 3; i++ {
		ctx, req := tp.Tracer("test").Start(context.Background(), "POST /payments")
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		id, err := outbox.Enqueue(ctx, tx, outbox.Event{
			EventType: "OrderPlaced", Destination: topic, Payload: []byte(secret),
			Headers: map[string]string{"tenant": "acme", "traceparent": "a user header"},
		})
		require.NoError(t, err)
		require.NoError(t, tx.Commit())
		req.End()
		reqs[id] = req
	}

	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{s.NameServer}, Group: testenv.Name(t, "ob")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	d, err := outbox.NewDispatcher(outbox.Config{DB: db, Sink: sink, Observe: observe.Observe{TracerProvider: tp}, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Start(context.Background()))
	t.Cleanup(func() { _ = d.Close() })

	tbl, err := outbox.NewTable("")
	require.NoError(t, err)
	for id, req := range reqs {
		consume, _ := waitApplied(t, exp, id)
		dispatch := waitSpan(t, exp, otelx.SpanDispatch, id)
		require.Equal(t, req.SpanContext().TraceID(), dispatch.SpanContext.TraceID(), id)
		require.Equal(t, req.SpanContext().SpanID(), dispatch.Parent.SpanID(), "dispatch under the enqueuing request")
		require.Equal(t, req.SpanContext().TraceID(), consume.SpanContext.TraceID(), id)
		require.Equal(t, dispatch.SpanContext.SpanID(), consume.Parent.SpanID(), "consume under the dispatch, across the broker")
		testenv.Eventually(t, 30*time.Second, "handler call", func() bool { _, ok := h.get(id); return ok })
		hs, _ := h.get(id)
		require.Equal(t, consume.SpanContext.SpanID(), hs.SpanID())

		// The stored trace context is not a header: not on the row as
		// read back, and not a property of the message.
		row, err := tbl.Get(context.Background(), db, id)
		require.NoError(t, err)
		require.Equal(t, map[string]string{"tenant": "acme", "traceparent": "a user header"}, row.Headers)
	}
	requireNoPayload(t, exp)
}

// Without a tracer on the dispatcher, the trace context Enqueue stored is
// passed on: the consumer's span still joins the enqueuing request's trace.
func TestTraceOutboxPassThroughWithoutTracer(t *testing.T) {
	s := testenv.Integration(t)
	db := setupDB(t)
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 4)
	coll := testenv.Collect(t, topic)
	exp, tp := traced(t)
	h := &handlerSpans{}
	startConsumer(t, db, topic, tp, h)

	ctx, req := tp.Tracer("test").Start(context.Background(), "POST /payments")
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	id, err := outbox.Enqueue(ctx, tx, outbox.Event{EventType: "OrderPlaced", Destination: topic, Payload: []byte(secret)})
	require.NoError(t, err)
	require.NoError(t, tx.Commit())
	req.End()

	sink, err := outbox.NewRocketMQSink(outbox.RocketMQConfig{NameServers: []string{s.NameServer}, Group: testenv.Name(t, "ob")})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	// Started under an unrelated span, which must not reach the message.
	startCtx, start := tp.Tracer("test").Start(context.Background(), "main")
	defer start.End()
	d, err := outbox.NewDispatcher(outbox.Config{DB: db, Sink: sink, PollInterval: 100 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, d.Start(startCtx))
	t.Cleanup(func() { _ = d.Close() })

	consume, _ := waitApplied(t, exp, id)
	require.Equal(t, req.SpanContext().TraceID(), consume.SpanContext.TraceID())
	require.Equal(t, req.SpanContext().SpanID(), consume.Parent.SpanID(), "no dispatch span: the request is the parent")
	require.Empty(t, spansOf(exp, otelx.SpanDispatch, id))
	coll.WaitDistinct(t, 1, 60*time.Second)
	m := coll.Message(id)
	require.True(t, strings.HasPrefix(m.GetProperty(otelx.PropTraceparent), "00-"+req.SpanContext().TraceID().String()))
	for k := range m.GetProperties() {
		require.NotContains(t, k, otelx.RowKeyPrefix, "no stored key became a property")
	}
}
