-- rmqtx consumer schema, version 2. {{consume_window}} is replaced by the
-- validated, prefixed table name. Idempotent (IF NOT EXISTS).

-- Crash-count windows: per consumer group and queue, the highest queue
-- offset a process may have started a handler on. A process commits a new
-- high offset (its offset plus a span) before it runs the first handler past
-- the old one, so a delivery at or below a window it did not commit itself
-- may have run in a process that ended: that delivery counts its attempt in
-- {{consume_attempt}} before its handler. Deliveries past it do not.
CREATE TABLE IF NOT EXISTS {{consume_window}} (
  consumer_group VARCHAR(255) NOT NULL,
  topic          VARCHAR(255) NOT NULL,
  broker_name    VARCHAR(128) NOT NULL,
  queue_id       INT          NOT NULL,
  high_offset    BIGINT       NOT NULL,
  updated_at     DATETIME(6)  NOT NULL,
  PRIMARY KEY (consumer_group, topic, broker_name, queue_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
