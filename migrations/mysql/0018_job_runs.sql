-- Runs of jobs that run once ever or once per slot (`dblock exec --once` / `--every`,
-- docs/run-once.md). One row per run: the lease's fence, who ran it, start and end on the
-- database clock, and its outcome; the end is written in the same fenced transaction that checks
-- the lease, so a holder that lost it records nothing. A success that is not forgotten
-- (`dblock runs --forget`) marks its key and slot done.
CREATE TABLE {{prefix}}job_run (
  run_key        VARBINARY(255) NOT NULL,
  slot           BIGINT         NOT NULL,
  fence          BIGINT         NOT NULL,
  period_ms      BIGINT         NOT NULL,
  host           VARCHAR(255)   NOT NULL,
  pid            BIGINT         NOT NULL,
  started_at     DATETIME(6)    NOT NULL,
  ended_at       DATETIME(6)    NULL,
  exit_status    INT            NULL,
  succeeded      SMALLINT       NOT NULL,
  forgotten_at   DATETIME(6)    NULL,
  forgotten_by   VARCHAR(255)   NULL,
  forget_reason  VARCHAR(1000)  NULL,
  PRIMARY KEY (run_key, slot, fence),
  KEY {{prefix}}job_run_started_idx (started_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
