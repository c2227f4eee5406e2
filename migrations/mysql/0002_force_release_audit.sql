-- Who forced a lease free, when and why (`dblock release --force`, dblock::force_release).
CREATE TABLE {{prefix}}resource_lock_audit (
  resource_name    VARBINARY(255) NOT NULL,
  new_fence        BIGINT         NOT NULL,
  previous_fence   BIGINT         NOT NULL,
  previous_owner   VARCHAR(64) CHARACTER SET ascii NOT NULL,
  previous_holder  VARCHAR(300)   NOT NULL,
  was_held         SMALLINT       NOT NULL,
  forced_by        VARCHAR(255)   NOT NULL,
  reason           VARCHAR(1000)  NOT NULL,
  forced_at        DATETIME(6)    NOT NULL,
  PRIMARY KEY (resource_name, new_fence),
  KEY {{prefix}}rla_forced_at_idx (forced_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
