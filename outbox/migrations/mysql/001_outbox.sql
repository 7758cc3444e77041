-- The outbox table. Times are UTC, DATETIME(6), written
-- with UTC_TIMESTAMP(6) so the session time zone never matters.
-- {{table}} is replaced by the validated, prefixed table name.
CREATE TABLE IF NOT EXISTS {{table}} (
    event_id           VARCHAR(64)  NOT NULL,
    aggregate_type     VARCHAR(128) NOT NULL DEFAULT '',
    aggregate_id       VARCHAR(128) NOT NULL DEFAULT '',
    aggregate_version  BIGINT       NOT NULL DEFAULT 0,
    event_type         VARCHAR(128) NOT NULL,
    event_version      INT          NOT NULL DEFAULT 0,
    destination        VARCHAR(128) NOT NULL,
    message_key        VARCHAR(128) NOT NULL DEFAULT '',
    payload            MEDIUMBLOB   NOT NULL,
    headers            TEXT         NULL,
    status             VARCHAR(16)  NOT NULL,
    owner_token        VARCHAR(96)  NULL,
    lease_until        DATETIME(6)  NULL,
    retry_count        INT          NOT NULL DEFAULT 0,
    next_retry_at      DATETIME(6)  NOT NULL,
    last_error_code    VARCHAR(64)  NULL,
    last_error_message VARCHAR(512) NULL,
    created_at         DATETIME(6)  NOT NULL,
    sent_at            DATETIME(6)  NULL,
    updated_at         DATETIME(6)  NOT NULL,
    PRIMARY KEY (event_id),
    -- the dispatcher's claim: due rows by status, oldest first
    KEY idx_outbox_dispatch (status, next_retry_at, created_at),
    -- per-aggregate order: "is there an earlier unsent version?" is answered
    -- from this index alone (status is the last column on purpose)
    KEY idx_outbox_aggregate (aggregate_type, aggregate_id, aggregate_version, status)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
