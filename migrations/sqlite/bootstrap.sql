-- Bookkeeping of applied migrations; created by `dblock migrate` before anything else.
CREATE TABLE IF NOT EXISTS {{prefix}}dblock_schema_migrations (
  version     INTEGER NOT NULL PRIMARY KEY,
  name        TEXT    NOT NULL,
  checksum    TEXT    NOT NULL,
  applied_at  INTEGER NOT NULL
);
