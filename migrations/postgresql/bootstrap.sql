-- Bookkeeping of applied migrations; created by `dblock migrate` before anything else.
CREATE TABLE IF NOT EXISTS {{prefix}}dblock_schema_migrations (
  version     INTEGER      NOT NULL PRIMARY KEY,
  name        VARCHAR(255) NOT NULL,
  checksum    CHAR(16)     NOT NULL,
  applied_at  TIMESTAMPTZ  NOT NULL DEFAULT clock_timestamp()
);
