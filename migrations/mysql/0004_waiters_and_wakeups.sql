-- The queue of waiters; see the PostgreSQL file. MySQL has no NOTIFY: wake-ups come from
-- the releasing process itself (in-process) and from polling bounded by the holder's expiry.
-- The ticket only orders waiters; an AUTO_INCREMENT value reused after a crash is still above
-- every row that exists, so the order stays the arrival order.
CREATE TABLE {{prefix}}lock_waiter (
  ticket         BIGINT       NOT NULL AUTO_INCREMENT,
  resource_name  VARBINARY(255) NOT NULL,
  owner_token    CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  enqueued_at    DATETIME(6)  NOT NULL,
  expires_at     DATETIME(6)  NOT NULL,
  holder_host    VARCHAR(255) NOT NULL,
  holder_pid     BIGINT       NOT NULL,
  PRIMARY KEY (ticket),
  KEY {{prefix}}lw_name_idx (resource_name, ticket),
  KEY {{prefix}}lw_expires_idx (expires_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
