-- Runs of jobs that run once ever or once per slot (`dblock exec --once` / `--every`,
-- docs/run-once.md). One row per run: the lease's fence, who ran it, start and end on the
-- database clock, and its outcome; the end is written in the same fenced transaction that checks
-- the lease, so a holder that lost it records nothing. A success that is not forgotten
-- (`dblock runs --forget`) marks its key and slot done.
CREATE TABLE {{prefix}}job_run (
  run_key        TEXT    NOT NULL CHECK (length(CAST(run_key AS BLOB)) BETWEEN 1 AND 255),
  slot           INTEGER NOT NULL,
  fence          INTEGER NOT NULL,
  period_ms      INTEGER NOT NULL,
  host           TEXT    NOT NULL,
  pid            INTEGER NOT NULL,
  started_at     INTEGER NOT NULL,
  ended_at       INTEGER,
  exit_status    INTEGER,
  succeeded      INTEGER NOT NULL,
  forgotten_at   INTEGER,
  forgotten_by   TEXT,
  forget_reason  TEXT,
  PRIMARY KEY (run_key, slot, fence)
);
CREATE INDEX {{prefix}}job_run_started_idx ON {{prefix}}job_run (started_at);
