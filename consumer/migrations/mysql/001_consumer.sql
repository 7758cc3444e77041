-- rmqtx consumer schema, version 1. {{consume_log}}, {{aggregate_version}},
-- {{consume_attempt}} and {{dead_letter}} are replaced by the validated,
-- prefixed table names. Every statement is idempotent (IF NOT EXISTS).
-- Timestamps are UTC, written with UTC_TIMESTAMP(6).

-- Consume log (dedup record): one row per (group, event id) whose effect
-- committed. It is inserted FIRST inside the business transaction, so it
-- exists if and only if the business effect committed (I4).
CREATE TABLE IF NOT EXISTS {{consume_log}} (
  consumer_group    VARCHAR(255) NOT NULL,
  event_id          VARCHAR(64)  NOT NULL,
  event_type        VARCHAR(128) NOT NULL,
  request_hash      CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  status            VARCHAR(16)  NOT NULL,
  result_ref        VARCHAR(255) NULL,
  retry_count       INT          NOT NULL DEFAULT 0,
  first_received_at DATETIME(6)  NOT NULL,
  updated_at        DATETIME(6)  NOT NULL,
  PRIMARY KEY (consumer_group, event_id),
  KEY idx_consume_log_updated (updated_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Aggregate-version guard: the last version applied per aggregate and group.
CREATE TABLE IF NOT EXISTS {{aggregate_version}} (
  consumer_group       VARCHAR(255) NOT NULL,
  aggregate_type       VARCHAR(128) NOT NULL,
  aggregate_id         VARCHAR(128) NOT NULL,
  last_applied_version BIGINT       NOT NULL,
  last_event_id        VARCHAR(64)  NOT NULL,
  updated_at           DATETIME(6)  NOT NULL,
  PRIMARY KEY (consumer_group, aggregate_type, aggregate_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Failed attempts of events not applied yet. Written in its own short
-- transaction after the business transaction rolled back, so a failure never
-- leaves a dedup row behind; removed when the event is applied or parked.
CREATE TABLE IF NOT EXISTS {{consume_attempt}} (
  consumer_group  VARCHAR(255)  NOT NULL,
  event_id        VARCHAR(128)  NOT NULL,
  attempts        INT           NOT NULL,
  last_class      VARCHAR(16)   NOT NULL,
  last_error      VARCHAR(2000) NOT NULL,
  first_failed_at DATETIME(6)   NOT NULL,
  updated_at      DATETIME(6)   NOT NULL,
  PRIMARY KEY (consumer_group, event_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Dead letters: what could not be applied, with everything needed to
-- understand it and to replay it with the ORIGINAL event id (properties holds
-- the envelope properties, keys and tags as JSON). Re-parking the same
-- message (group, event id, payload hash) updates the row instead of adding one.
CREATE TABLE IF NOT EXISTS {{dead_letter}} (
  id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  consumer_group   VARCHAR(255) NOT NULL,
  topic            VARCHAR(255) NOT NULL,
  queue_id         INT          NOT NULL,
  queue_offset     BIGINT       NOT NULL,
  msg_id           VARCHAR(128) NOT NULL,
  event_id         VARCHAR(128) NOT NULL,
  event_type       VARCHAR(128) NOT NULL,
  business_key     VARCHAR(128) NOT NULL,
  error_class      VARCHAR(16)  NOT NULL,
  error_text       TEXT         NOT NULL,
  payload          MEDIUMBLOB   NULL,
  payload_redacted TINYINT(1)   NOT NULL DEFAULT 0,
  request_hash     CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  existing_hash    CHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL,
  properties       MEDIUMTEXT   NOT NULL,
  reconsume_times  INT          NOT NULL,
  park_count       INT          NOT NULL DEFAULT 1,
  status           VARCHAR(16)  NOT NULL,
  first_seen_at    DATETIME(6)  NOT NULL,
  last_seen_at     DATETIME(6)  NOT NULL,
  replay_count     INT          NOT NULL DEFAULT 0,
  replayed_at      DATETIME(6)  NULL,
  resolved_at      DATETIME(6)  NULL,
  resolution_note  VARCHAR(512) NULL,
  PRIMARY KEY (id),
  UNIQUE KEY uk_dead_letter_message (consumer_group, event_id, request_hash),
  KEY idx_dead_letter_status_seen (status, last_seen_at),
  KEY idx_dead_letter_business_key (business_key),
  KEY idx_dead_letter_event_type (event_type)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
