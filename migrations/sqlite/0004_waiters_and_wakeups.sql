-- The queue of waiters; see the PostgreSQL file. AUTOINCREMENT: a ticket is never reused.
-- Wake-ups across processes go through a doorbell directory beside the database file.
CREATE TABLE {{prefix}}lock_waiter (
  ticket         INTEGER PRIMARY KEY AUTOINCREMENT,
  resource_name  TEXT    NOT NULL CHECK (length(CAST(resource_name AS BLOB)) BETWEEN 1 AND 255),
  owner_token    TEXT    NOT NULL,
  enqueued_at    INTEGER NOT NULL,
  expires_at     INTEGER NOT NULL,
  holder_host    TEXT    NOT NULL,
  holder_pid     INTEGER NOT NULL
);
CREATE INDEX {{prefix}}lw_name_idx ON {{prefix}}lock_waiter (resource_name, ticket);
CREATE INDEX {{prefix}}lw_expires_idx ON {{prefix}}lock_waiter (expires_at);
