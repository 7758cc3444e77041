package consumer

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/migrate"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/wire"
)

// setupDB migrates db (a fresh database of testenv.EachDB) with the
// consumer tables and adds a business table "effect" that records every
// handler run that committed. It has no unique key on event_id on purpose: a
// duplicate effect would show.
func setupDB(t *testing.T, db *sqlx.DB) *sqlx.DB {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, migrateTables(ctx, db, ""))
	ddl := []string{`CREATE TABLE effect (
		id BIGINT AUTO_INCREMENT PRIMARY KEY,
		event_id VARCHAR(64) NOT NULL,
		agg_id VARCHAR(128) NOT NULL,
		version BIGINT NOT NULL,
		payload VARBINARY(1024) NOT NULL,
		KEY (event_id))`}
	if db.DriverName() != "mysql" {
		ddl = []string{`CREATE TABLE effect (
		id BIGSERIAL PRIMARY KEY,
		event_id VARCHAR(64) NOT NULL,
		agg_id VARCHAR(128) NOT NULL,
		version BIGINT NOT NULL,
		payload BYTEA NOT NULL)`, "CREATE INDEX effect_event_id ON effect (event_id)"}
	}
	for _, q := range ddl {
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	return db
}

// eachDB runs body on each database (testenv.EachDB) with the tables of
// setupDB, the two as parallel subtests.
func eachDB(t *testing.T, body func(t *testing.T, db *sqlx.DB)) {
	t.Helper()
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		t.Parallel()
		body(t, setupDB(t, db))
	})
}

// exec runs a fixture statement written with "?" placeholders.
func exec(t testing.TB, db *sqlx.DB, q string, args ...any) {
	t.Helper()
	_, err := db.Exec(db.Rebind(q), args...)
	require.NoError(t, err)
}

// migrateTables creates the consumer tables under prefix as
// schema.MigrateAll does (one version table, <prefix>schema_migrations),
// which in-package tests cannot import.
func migrateTables(ctx context.Context, db *sqlx.DB, prefix string) error {
	d, err := dialect.For(db)
	if err != nil {
		return err
	}
	fsys, names, err := Migrations(d.Name(), prefix)
	if err != nil {
		return err
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return migrate.Run(ctx, db, prefix+"schema_migrations", migrate.Part{Name: "consumer", FS: fsys, Replace: names})
}

// idleDB is a handle of the mysql driver that is never connected: for
// tests of validation, which reads only its driver name.
func idleDB() *sqlx.DB { return sqlx.NewDb(nil, "mysql") }

// effectHandler inserts one effect row per run.
func effectHandler(ctx context.Context, tx *sqlx.Tx, ev Event) error {
	_, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO effect (event_id, agg_id, version, payload) VALUES (?, ?, ?, ?)"),
		ev.ID, ev.AggregateID, ev.AggregateVersion, ev.Payload)
	return err
}

func countRows(t testing.TB, db *sqlx.DB, q string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, db.Get(&n, db.Rebind(q), args...))
	return n
}

func effects(t testing.TB, db *sqlx.DB) int { return countRows(t, db, "SELECT COUNT(*) FROM effect") }

// msg builds a Message as the broker would deliver it.
func msg(env wire.Envelope, payload string) Message {
	body := []byte(payload)
	return Message{Body: body, Properties: env.Properties(body), Delivery: Delivery{
		Topic: "t", MsgID: "m-" + env.EventID, StoredAt: time.Now().UTC(),
	}}
}

func ev(id, typ string) wire.Envelope { return wire.Envelope{EventID: id, EventType: typ} }

func aggEv(id, aggID string, version int64) wire.Envelope {
	return wire.Envelope{EventID: id, EventType: "Moved", AggregateType: "Box", AggregateID: aggID, AggregateVersion: version}
}
