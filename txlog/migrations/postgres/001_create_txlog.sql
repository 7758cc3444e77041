-- rmqtx transaction log (PostgreSQL; the same table as migrations/mysql).
-- One row per decided transaction, keyed by the event id. A COMMITTED row is
-- inserted as the first statement of the local transaction and becomes
-- visible only when it commits; a ROLLED_BACK row is written by a fence
-- (check-back, recovery), a persisted local rollback or a resolver.
-- {{table}} is replaced by the validated, prefixed table name. Times are
-- instants in TIMESTAMPTZ(6) (MySQL's DATETIME(6) holds them as UTC).
CREATE TABLE IF NOT EXISTS {{table}} (
  event_id          VARCHAR(64)   NOT NULL,
  producer_group    VARCHAR(255)  NOT NULL DEFAULT '',
  topic             VARCHAR(255)  NOT NULL DEFAULT '',
  tags              VARCHAR(255)  NOT NULL DEFAULT '',
  msg_keys          VARCHAR(1024) NOT NULL DEFAULT '',
  event_type        VARCHAR(128)  NOT NULL DEFAULT '',
  state             VARCHAR(16)   NOT NULL,
  payload           BYTEA         NULL,
  payload_hash      VARCHAR(64)   NOT NULL DEFAULT '',
  properties        TEXT          NULL,
  business_key      VARCHAR(128)  NOT NULL DEFAULT '',
  created_at        TIMESTAMPTZ(6)  NOT NULL,
  resolved_at       TIMESTAMPTZ(6)  NOT NULL,
  resolved_by       VARCHAR(16)   NOT NULL,
  recovered_at      TIMESTAMPTZ(6)  NULL,
  recovery_decision VARCHAR(16)   NULL,
  recovery_note     VARCHAR(255)  NULL,
  PRIMARY KEY (event_id)
);
-- Index names are per schema in PostgreSQL: derived from the table's.
CREATE INDEX IF NOT EXISTS {{table}}_state_resolved ON {{table}} (state, resolved_at);
CREATE INDEX IF NOT EXISTS {{table}}_group_created ON {{table}} (producer_group, created_at);
