-- rmqtx replay audit, version 1. {{prefix}} is replaced by the validated table
-- prefix. One row per replay run (who, why, which scope, counts, result) and
-- one row per dead letter the run touched. Timestamps are UTC DATETIME(6).
CREATE TABLE IF NOT EXISTS {{prefix}}replay_audit (
  id               BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  operator         VARCHAR(128)  NOT NULL,
  reason           VARCHAR(1024) NOT NULL,
  scope            TEXT          NOT NULL,
  rate_limit       DOUBLE        NOT NULL,
  batch_size       INT           NOT NULL,
  selected         INT           NOT NULL DEFAULT 0,
  sent             INT           NOT NULL DEFAULT 0,
  failed           INT           NOT NULL DEFAULT 0,
  skipped          INT           NOT NULL DEFAULT 0,
  new_dead_letters INT           NOT NULL DEFAULT 0,
  result           VARCHAR(32)   NOT NULL,
  error_text       VARCHAR(2000) NULL,
  started_at       DATETIME(6)   NOT NULL,
  finished_at      DATETIME(6)   NULL,
  PRIMARY KEY (id),
  KEY idx_replay_audit_started (started_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{prefix}}replay_audit_item (
  audit_id       BIGINT UNSIGNED NOT NULL,
  dead_letter_id BIGINT UNSIGNED NOT NULL,
  consumer_group VARCHAR(255)  NOT NULL,
  event_id       VARCHAR(128)  NOT NULL,
  topic          VARCHAR(255)  NOT NULL,
  result         VARCHAR(16)   NOT NULL,
  msg_id         VARCHAR(128)  NOT NULL DEFAULT '',
  detail         VARCHAR(512)  NOT NULL DEFAULT '',
  at             DATETIME(6)   NOT NULL,
  PRIMARY KEY (audit_id, dead_letter_id),
  KEY idx_replay_audit_item_event (event_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
