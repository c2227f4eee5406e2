-- Lease locks; see the PostgreSQL file for the design. Times are INTEGER microseconds since
-- the epoch on the clock of the process that wrote them (SQLite has no server clock).
CREATE TABLE {{prefix}}resource_lock (
  resource_name  TEXT    NOT NULL PRIMARY KEY
                 CHECK (length(CAST(resource_name AS BLOB)) BETWEEN 1 AND 255),
  owner_token    TEXT    NOT NULL,
  fence          INTEGER NOT NULL CHECK (fence > 0),
  hold_count     INTEGER NOT NULL CHECK (hold_count >= 0),
  acquired_at    INTEGER NOT NULL,
  expires_at     INTEGER NOT NULL,
  holder_host    TEXT    NOT NULL,
  holder_pid     INTEGER NOT NULL,
  holder_thread  TEXT    NOT NULL
);
CREATE INDEX {{prefix}}rl_expires_idx ON {{prefix}}resource_lock (expires_at);
CREATE TABLE {{prefix}}resource_lock_fence_floor (
  id         INTEGER NOT NULL PRIMARY KEY CHECK (id = 1),
  max_fence  INTEGER NOT NULL
);
INSERT INTO {{prefix}}resource_lock_fence_floor (id, max_fence) VALUES (1, 0);
