-- Bookkeeping of applied migrations; created by `dblock migrate` before anything else.
CREATE TABLE IF NOT EXISTS {{prefix}}dblock_schema_migrations (
  version     INT          NOT NULL PRIMARY KEY,
  name        VARCHAR(255) NOT NULL,
  checksum    CHAR(16)     NOT NULL,
  applied_at  DATETIME(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
