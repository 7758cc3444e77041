-- The outbox table (PostgreSQL; the same table as migrations/mysql). Times
-- are instants in TIMESTAMPTZ(6) (MySQL's DATETIME(6) holds them as UTC),
-- written with the database clock, so the session time zone never matters. {{table}} is replaced by
-- the validated, prefixed table name.
CREATE TABLE IF NOT EXISTS {{table}} (
    event_id           VARCHAR(64)  NOT NULL,
    aggregate_type     VARCHAR(128) NOT NULL DEFAULT '',
    aggregate_id       VARCHAR(128) NOT NULL DEFAULT '',
    aggregate_version  BIGINT       NOT NULL DEFAULT 0,
    event_type         VARCHAR(128) NOT NULL,
    event_version      INT          NOT NULL DEFAULT 0,
    destination        VARCHAR(128) NOT NULL,
    message_key        VARCHAR(128) NOT NULL DEFAULT '',
    payload            BYTEA        NOT NULL,
    headers            TEXT         NULL,
    status             VARCHAR(16)  NOT NULL,
    owner_token        VARCHAR(96)  NULL,
    lease_until        TIMESTAMPTZ(6) NULL,
    retry_count        INT          NOT NULL DEFAULT 0,
    next_retry_at      TIMESTAMPTZ(6) NOT NULL,
    last_error_code    VARCHAR(64)  NULL,
    last_error_message VARCHAR(512) NULL,
    created_at         TIMESTAMPTZ(6) NOT NULL,
    sent_at            TIMESTAMPTZ(6) NULL,
    updated_at         TIMESTAMPTZ(6) NOT NULL,
    PRIMARY KEY (event_id)
);
-- Index names are per schema in PostgreSQL: derived from the table's.
-- The dispatcher's claim: due rows by status, oldest first.
CREATE INDEX IF NOT EXISTS {{table}}_dispatch ON {{table}} (status, next_retry_at, created_at);
-- Per-aggregate order: "is there an earlier unsent version?" is answered
-- from this index alone (status is the last column on purpose).
CREATE INDEX IF NOT EXISTS {{table}}_aggregate ON {{table}} (aggregate_type, aggregate_id, aggregate_version, status);
