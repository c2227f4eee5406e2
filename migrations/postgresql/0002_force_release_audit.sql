-- Who forced a lease free, when and why (`dblock release --force`, dblock::force_release).
CREATE TABLE {{prefix}}resource_lock_audit (
  resource_name    VARCHAR(255)   NOT NULL,
  new_fence        BIGINT         NOT NULL,
  previous_fence   BIGINT         NOT NULL,
  previous_owner   VARCHAR(64)    NOT NULL,
  previous_holder  VARCHAR(300)   NOT NULL,
  was_held         SMALLINT       NOT NULL,
  forced_by        VARCHAR(255)   NOT NULL,
  reason           VARCHAR(1000)  NOT NULL,
  forced_at        TIMESTAMPTZ(6) NOT NULL,
  CONSTRAINT {{prefix}}rla_pkey PRIMARY KEY (resource_name, new_fence)
);
CREATE INDEX {{prefix}}rla_forced_at_idx ON {{prefix}}resource_lock_audit (forced_at);
