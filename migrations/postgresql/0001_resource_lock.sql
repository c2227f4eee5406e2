-- Lease locks. One row per resource name, kept after release (hold_count = 0) so that its
-- fencing token keeps growing; the reaper deletes long-expired rows and first raises the
-- fence floor above their fences, so a re-created row starts higher still.
CREATE TABLE {{prefix}}resource_lock (
  resource_name  VARCHAR(255)   NOT NULL,
  owner_token    CHAR(32)       NOT NULL,
  fence          BIGINT         NOT NULL,
  hold_count     INTEGER        NOT NULL,
  acquired_at    TIMESTAMPTZ(6) NOT NULL,
  expires_at     TIMESTAMPTZ(6) NOT NULL,
  holder_host    VARCHAR(255)   NOT NULL,
  holder_pid     BIGINT         NOT NULL,
  holder_thread  VARCHAR(64)    NOT NULL,
  CONSTRAINT {{prefix}}rl_pkey PRIMARY KEY (resource_name),
  CONSTRAINT {{prefix}}rl_fence_pos CHECK (fence > 0),
  CONSTRAINT {{prefix}}rl_hold_nonneg CHECK (hold_count >= 0)
);
CREATE INDEX {{prefix}}rl_expires_idx ON {{prefix}}resource_lock (expires_at);
-- Fences of new rows start above max_fence (one row, id = 1).
CREATE TABLE {{prefix}}resource_lock_fence_floor (
  id         SMALLINT NOT NULL PRIMARY KEY CHECK (id = 1),
  max_fence  BIGINT   NOT NULL
);
INSERT INTO {{prefix}}resource_lock_fence_floor (id, max_fence) VALUES (1, 0);
