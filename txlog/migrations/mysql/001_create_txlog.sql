-- rmqtx transaction log. One row per decided transaction, keyed by the
-- event id. A COMMITTED row is inserted as the first statement of the local
-- transaction and becomes visible only when it commits; a ROLLED_BACK row is
-- written by a fence (check-back, recovery), a persisted local rollback or a
-- resolver. {{table}} is replaced by the validated, prefixed table name.
CREATE TABLE IF NOT EXISTS {{table}} (
  event_id          VARCHAR(64)   NOT NULL,
  producer_group    VARCHAR(255)  NOT NULL DEFAULT '',
  topic             VARCHAR(255)  NOT NULL DEFAULT '',
  tags              VARCHAR(255)  NOT NULL DEFAULT '',
  msg_keys          VARCHAR(1024) NOT NULL DEFAULT '',
  event_type        VARCHAR(128)  NOT NULL DEFAULT '',
  state             VARCHAR(16)   NOT NULL,
  payload           MEDIUMBLOB    NULL,
  payload_hash      VARCHAR(64)   NOT NULL DEFAULT '',
  properties        MEDIUMTEXT    NULL,
  business_key      VARCHAR(128)  NOT NULL DEFAULT '',
  created_at        DATETIME(6)   NOT NULL,
  resolved_at       DATETIME(6)   NOT NULL,
  resolved_by       VARCHAR(16)   NOT NULL,
  recovered_at      DATETIME(6)   NULL,
  recovery_decision VARCHAR(16)   NULL,
  recovery_note     VARCHAR(255)  NULL,
  PRIMARY KEY (event_id),
  KEY {{table}}_state_resolved (state, resolved_at),
  KEY {{table}}_group_created (producer_group, created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
