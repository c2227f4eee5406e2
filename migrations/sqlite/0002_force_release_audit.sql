-- Who forced a lease free, when and why (`dblock release --force`, dblock::force_release).
CREATE TABLE {{prefix}}resource_lock_audit (
  resource_name    TEXT    NOT NULL,
  new_fence        INTEGER NOT NULL,
  previous_fence   INTEGER NOT NULL,
  previous_owner   TEXT    NOT NULL,
  previous_holder  TEXT    NOT NULL,
  was_held         INTEGER NOT NULL,
  forced_by        TEXT    NOT NULL,
  reason           TEXT    NOT NULL,
  forced_at        INTEGER NOT NULL,
  PRIMARY KEY (resource_name, new_fence)
);
CREATE INDEX {{prefix}}rla_forced_at_idx ON {{prefix}}resource_lock_audit (forced_at);
