package replay_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	rmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/replay"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/wire"
)

// deadLetter is a dead-letter row written straight into the consumer's
// schema, for tests that need many or unusual rows quickly.
type deadLetter struct {
	Group, Topic, EventID, Type, Key, Class, Status string
	Payload                                         []byte
	Redacted                                        bool
	Hash                                            string // default wire.Hash(Payload)
	FirstSeen                                       time.Time
}

func insertDeadLetter(t *testing.T, db *sqlx.DB, dl deadLetter) int64 {
	t.Helper()
	if dl.Status == "" {
		dl.Status = consumer.DeadLetterParked
	}
	if dl.Class == "" {
		dl.Class = string(consumer.ClassPermanent)
	}
	if dl.Type == "" {
		dl.Type = "OrderPaid"
	}
	if dl.EventID == "" {
		dl.EventID = wire.NewEventID()
	}
	if dl.Payload == nil {
		dl.Payload = []byte(`{"order":"` + dl.EventID + `","amount":42}`)
	}
	if dl.Hash == "" {
		dl.Hash = wire.Hash(dl.Payload)
	}
	if dl.FirstSeen.IsZero() {
		dl.FirstSeen = time.Now().UTC().Add(-time.Hour)
	}
	env := wire.Envelope{EventID: dl.EventID, EventType: dl.Type, BusinessKey: dl.Key}
	props := env.Properties(dl.Payload)
	props["KEYS"] = dl.EventID
	pj, _ := json.Marshal(props)
	d := dialect.Must(db)
	id, err := d.InsertID(context.Background(), db, db.Rebind(`INSERT INTO rmqtx_dead_letter (consumer_group, topic, queue_id, queue_offset, msg_id, event_id, event_type,
		business_key, error_class, error_text, payload, payload_redacted, request_hash, properties, reconsume_times, status,
		first_seen_at, last_seen_at) VALUES (?, ?, 0, 0, 'm', ?, ?, ?, ?, 'handler said no', ?, ?, ?, ?, 0, ?, ?, ?)`), "id",
		dl.Group, dl.Topic, dl.EventID, dl.Type, dl.Key, dl.Class, dl.Payload, dl.Redacted, dl.Hash, string(pj), dl.Status, dl.FirstSeen, dl.FirstSeen)
	require.NoError(t, err)
	return id
}

// migrated migrates db (a fresh database of testenv.EachDB) and returns it.
func migrated(t *testing.T, db *sqlx.DB) *sqlx.DB {
	t.Helper()
	require.NoError(t, schema.MigrateAll(context.Background(), db, ""))
	return db
}

func newReplayer(t *testing.T, cfg replay.Config) *replay.Replayer {
	t.Helper()
	r, err := replay.New(cfg)
	require.NoError(t, err)
	if len(cfg.NameServers) > 0 {
		require.NoError(t, r.Start(context.Background()))
		t.Cleanup(func() { _ = r.Close() })
	}
	return r
}

// publish sends plain rmqtx-enveloped messages (as the outbox would).
func publish(t *testing.T, s testenv.Settings, topic string, envs []wire.Envelope, payload func(wire.Envelope) []byte) {
	t.Helper()
	g := testenv.Name(t, "pub")
	p, err := rmq.NewProducer(producer.WithNsResolver(s.NameServerResolver()), producer.WithGroupName(g), producer.WithInstanceName(g))
	require.NoError(t, err)
	require.NoError(t, p.Start())
	defer func() { _ = p.Shutdown() }()
	for _, e := range envs {
		body := payload(e)
		m := primitive.NewMessage(topic, body)
		m.WithProperties(e.Properties(body))
		m.WithKeys([]string{e.EventID})
		res, err := p.SendSync(context.Background(), m)
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, res.Status)
	}
}

// metricValue reads one sample from the registry by name and labels.
func metricValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if got[k] != v {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func countRows(t *testing.T, db *sqlx.DB, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, db.Rebind(q), args...))
	return n
}
