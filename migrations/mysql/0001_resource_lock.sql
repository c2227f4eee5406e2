-- Lease locks; see the PostgreSQL file for the design. resource_name is VARBINARY so that
-- names compare byte for byte ('a', 'A' and 'a ' are different locks); times are UTC.
CREATE TABLE {{prefix}}resource_lock (
  resource_name  VARBINARY(255) NOT NULL,
  owner_token    CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
  fence          BIGINT       NOT NULL,
  hold_count     INT          NOT NULL,
  acquired_at    DATETIME(6)  NOT NULL,
  expires_at     DATETIME(6)  NOT NULL,
  holder_host    VARCHAR(255) NOT NULL,
  holder_pid     BIGINT       NOT NULL,
  holder_thread  VARCHAR(64)  NOT NULL,
  PRIMARY KEY (resource_name),
  KEY {{prefix}}rl_expires_idx (expires_at),
  CONSTRAINT {{prefix}}rl_fence_pos CHECK (fence > 0),
  CONSTRAINT {{prefix}}rl_hold_nonneg CHECK (hold_count >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE {{prefix}}resource_lock_fence_floor (
  id         SMALLINT NOT NULL PRIMARY KEY,
  max_fence  BIGINT   NOT NULL,
  CONSTRAINT {{prefix}}rl_floor_one CHECK (id = 1)
) ENGINE=InnoDB;
INSERT INTO {{prefix}}resource_lock_fence_floor (id, max_fence) VALUES (1, 0);
