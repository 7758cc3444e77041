-- The payment example's business tables on MySQL and MariaDB (schema_postgres.sql
-- is the PostgreSQL version). Every statement is idempotent
-- (CREATE TABLE IF NOT EXISTS); rmqtx's own tables (txlog, consume log,
-- outboxes) come from their packages' migrations.

-- users: who pays and who gets the SMS.
CREATE TABLE IF NOT EXISTS users (
  id         BIGINT       NOT NULL PRIMARY KEY,
  name       VARCHAR(64)  NOT NULL,
  phone      VARCHAR(32)  NOT NULL
) ENGINE=InnoDB;

-- orders: owned by the order service. version counts the order's own
-- changes (1 created, 2 paid, 3 canceled) and is the aggregate version of
-- the order events.
CREATE TABLE IF NOT EXISTS orders (
  id           VARCHAR(64)  NOT NULL PRIMARY KEY,
  user_id      BIGINT       NOT NULL,
  amount_cents BIGINT       NOT NULL,
  currency     CHAR(3)      NOT NULL,
  status       VARCHAR(16)  NOT NULL,
  version      INT          NOT NULL,
  created_at   DATETIME(6)  NOT NULL,
  updated_at   DATETIME(6)  NOT NULL,
  KEY orders_user (user_id)
) ENGINE=InnoDB;

-- payments: one per order. PENDING -> SUCCESS happens once, by a
-- conditional update in the callback's local transaction.
CREATE TABLE IF NOT EXISTS payments (
  id             VARCHAR(64)  NOT NULL PRIMARY KEY,
  order_id       VARCHAR(64)  NOT NULL,
  user_id        BIGINT       NOT NULL,
  amount_cents   BIGINT       NOT NULL,
  currency       CHAR(3)      NOT NULL,
  status         VARCHAR(16)  NOT NULL,
  gateway_txn_id VARCHAR(64)  NULL,
  event_id       VARCHAR(64)  NULL,
  created_at     DATETIME(6)  NOT NULL,
  paid_at        DATETIME(6)  NULL,
  updated_at     DATETIME(6)  NOT NULL,
  UNIQUE KEY payments_order (order_id),
  KEY payments_status (status)
) ENGINE=InnoDB;

-- points_ledger: written by the points consumer, one row per payment.
-- The unique keys are a second line of defence behind the consume log.
CREATE TABLE IF NOT EXISTS points_ledger (
  id          BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
  payment_id  VARCHAR(64)  NOT NULL,
  event_id    VARCHAR(64)  NOT NULL,
  user_id     BIGINT       NOT NULL,
  points      BIGINT       NOT NULL,
  created_at  DATETIME(6)  NOT NULL,
  UNIQUE KEY points_payment (payment_id),
  UNIQUE KEY points_event (event_id)
) ENGINE=InnoDB;

-- points_balance: the user's balance, kept in the same transaction.
CREATE TABLE IF NOT EXISTS points_balance (
  user_id    BIGINT       NOT NULL PRIMARY KEY,
  points     BIGINT       NOT NULL,
  updated_at DATETIME(6)  NOT NULL
) ENGINE=InnoDB;

-- notifications: written by the notification consumer together with the
-- command-outbox row that sends the SMS.
CREATE TABLE IF NOT EXISTS notifications (
  event_id    VARCHAR(64)   NOT NULL PRIMARY KEY,
  payment_id  VARCHAR(64)   NOT NULL,
  user_id     BIGINT        NOT NULL,
  phone       VARCHAR(32)   NOT NULL,
  body        VARCHAR(255)  NOT NULL,
  created_at  DATETIME(6)   NOT NULL,
  UNIQUE KEY notifications_payment (payment_id)
) ENGINE=InnoDB;

-- sms_gateway_log: the SMS gateway stub's own record (the "external
-- system"): one row per idempotency key, with how often it was called.
CREATE TABLE IF NOT EXISTS sms_gateway_log (
  idempotency_key VARCHAR(64)   NOT NULL PRIMARY KEY,
  phone           VARCHAR(32)   NOT NULL,
  body            VARCHAR(255)  NOT NULL,
  calls           INT           NOT NULL,
  first_at        DATETIME(6)   NOT NULL,
  last_at         DATETIME(6)   NOT NULL
) ENGINE=InnoDB;

-- order_search: the search projection (an "ES index" kept in MariaDB),
-- written only through the consumer's monotonic version guard.
CREATE TABLE IF NOT EXISTS order_search (
  order_id     VARCHAR(64)  NOT NULL PRIMARY KEY,
  user_id      BIGINT       NOT NULL,
  amount_cents BIGINT       NOT NULL,
  currency     CHAR(3)      NOT NULL,
  status       VARCHAR(16)  NOT NULL,
  version      INT          NOT NULL,
  event_id     VARCHAR(64)  NOT NULL,
  updated_at   DATETIME(6)  NOT NULL
) ENGINE=InnoDB;
